"""scripts/bench_ab.py through its command line: two arms of `recguide bench`, alternating, compared run by run."""

from __future__ import annotations

import importlib.util
import json
import subprocess

import pytest

from recguide_trt.model import save_checkpoint
from tests.conftest import random_model, tiny_config
from tests.scripts.runner import ROOT, run_script

pytest.importorskip("matplotlib")


def run(*args: str) -> subprocess.CompletedProcess:
    return run_script("bench_ab.py", *args)


def _module():
    spec = importlib.util.spec_from_file_location("bench_ab", ROOT / "scripts" / "bench_ab.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _in_git_checkout() -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _in_git_checkout(), reason="arm a checks out HEAD: needs a git checkout")
def test_two_arms_alternate_and_are_compared_run_by_run(tmp_path):
    ckpt = tmp_path / "rand"
    save_checkpoint(random_model(tiny_config()), ckpt)
    out = tmp_path / "ab"
    p = run("--a-rev", "HEAD", "--b-args", "--recguide switch_concurrency=0", "--runs", "2", "--out", str(out), "--",
            "--model", str(ckpt), "--workload", "random", "--concurrency", "1", "--policies", "ar,recguide",
            "--requests", "1", "--max-tokens", "4", "--ignore-eos", "--num-prompts", "2", "--no-plots")
    assert p.returncode == 0, p.stderr[-2000:]
    # Runs a b, then b a; arm b's override reached its runs only.
    assert [line.split(",")[0] for line in p.stderr.splitlines() if line.startswith("bench_ab: run")] == [
        "bench_ab: run 1/2", "bench_ab: run 1/2", "bench_ab: run 2/2", "bench_ab: run 2/2"]
    assert [line.split("arm ")[1][0] for line in p.stderr.splitlines() if "arm " in line] == ["a", "b", "b", "a"]
    for arm in "ab":
        for i in (1, 2):
            res = json.loads((out / f"{arm}-{i}" / "results.json").read_text())
            assert (res["config"]["recguide"] or []) == (["switch_concurrency=0"] if arm == "b" else [])
    worktrees = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    assert "bench_ab-" not in worktrees, worktrees            # the checkout of HEAD is gone
    summary = json.loads((out / "summary.json").read_text())
    assert summary["arms"] == {"a": "HEAD", "b": "the working tree --recguide switch_concurrency=0"}
    (row,) = summary["rows"]
    assert (row["C"], row["reference"], row["pairs"]) == (1, "ar", 2) and 0 <= row["b_ahead"] <= 2
    for arm in "ab":   # each run's own ratio, read back from its results
        for i, ratio in enumerate(row[arm], 1):
            cells = {c["policy"]: c["throughput"]["output_tok_s"]
                     for c in json.loads((out / f"{arm}-{i}" / "results.json").read_text())["cells"]}
            assert ratio == pytest.approx(cells["recguide"] / cells["ar"])
    assert row["b_over_a"] == pytest.approx(sum(row["b"]) / sum(row["a"]))
    assert "| 1 | ar |" in (out / "summary.md").read_text()


def test_order_swaps_every_run_and_summaries_pair_runs():
    mod = _module()
    assert mod.parse_args(["--out", "rel"]).out.is_absolute()   # runs work in their arm's tree: not relative to it
    assert [mod.order(i) for i in range(4)] == [("a", "b"), ("b", "a"), ("a", "b"), ("b", "a")]
    ratios = {"a": [{1: {"ar": 1.5, "lookup": 1.0}}, {1: {"ar": 1.7, "lookup": 1.1}}],
              "b": [{1: {"ar": 1.6, "lookup": 0.9}}, {1: {"ar": 1.6, "lookup": 1.2}}]}
    rows = {r["reference"]: r for r in mod.summarise(ratios)}
    assert rows["ar"]["b_ahead"] == 1 and rows["ar"]["b_over_a"] == pytest.approx(1.0)
    assert rows["lookup"]["b_ahead"] == 1 and rows["lookup"]["a_mean"] == pytest.approx(1.05)


@pytest.mark.parametrize("args, message", [
    (["--runs", "0", "--out", "X"], "--runs must be >= 1"),
    (["--out", "X", "--", "--out", "Y"], "each run's output directory is set by this script"),
    (["--out", "X", "--a-args", "--recguide 'x"], "--a-args: No closing quotation"),
    (["--out", "X", "--a-rev", "no-such-rev-xyz"], "cannot check out 'no-such-rev-xyz'"),
])
def test_bad_options_are_refused_in_one_line(tmp_path, args, message):
    p = run(*[str(tmp_path / a) if a in ("X", "Y") else a for a in args])
    assert p.returncode != 0 and message in p.stderr and "Traceback" not in p.stderr, p.stderr
