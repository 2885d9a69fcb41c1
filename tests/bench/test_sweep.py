"""The closed-loop concurrency sweep (recguide bench) on a tiny random checkpoint."""

from __future__ import annotations

import argparse
import json

import pytest

from recguide_trt.bench.loop import run_cell
from recguide_trt.bench.sweep import add_bench_args, run_bench, typical_context
from recguide_trt.runtime.params import SamplingParams
from tests.bench.console import recguide_bench

pytest.importorskip("matplotlib")


def test_tiny_sweep_writes_everything(ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("RECGUIDE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    args = add_bench_args(argparse.ArgumentParser()).parse_args([
        "--model", str(ckpt), "--workload", "random", "--concurrency", "1,2", "--policies", "linearspec,recguide",
        "--blocks", "2", "--requests", "2", "--max-tokens", "8", "--ignore-eos", "--num-prompts", "8",
        "--traces", "--no-progress", "--out", str(out), "--cost-past-len", "7"])
    assert run_bench(args) == 0
    for name in ("results.json", "table.md", "pareto.png", "speedup.png", "traces.json"):
        assert (out / name).is_file(), name
    table = (out / "table.md").read_text()
    assert "RecGuide / vanilla (linearspec-L4)" in table and "RecGuide / best fixed" in table
    res = json.loads((out / "results.json").read_text())
    assert res["policies"] == ["linearspec-L2", "linearspec-L4", "recguide"]
    assert {"cpu", "torch", "backend", "model_fingerprint", "date", "command"} <= set(res["environment"])
    assert res["calibration"]["cost_table"]["meta"]["past_len"] == 7
    assert len(res["cells"]) == 6
    # Interleaved: every policy at C=1 before any at C=2.
    assert [c["C"] for c in res["cells"]] == [1, 1, 1, 2, 2, 2]
    for cell in res["cells"]:
        C = cell["C"]
        assert cell["inflight"] == {"min": C, "max": C}
        assert set(cell["engine"]["concurrency_hist"]) == {str(C)}  # the engine always ran exactly C
        assert cell["metrics"]["requests"] == max(2 * C, 2)
        assert cell["metrics"]["output_tokens"] == 8 * max(2 * C, 2)
        assert cell["throughput"]["output_tok_s"] > 0
        for key in ("mal", "tpf", "ttft_mean", "tpot_mean", "per_request_tok_s", "forwards", "block_sizes"):
            assert key in cell["metrics"]
    rg = [c for c in res["cells"] if c["policy"] == "recguide"]
    assert all(sum(c["engine"]["recguide_mode_steps"].values()) > 0 for c in rg)
    for row in res["summary"]:
        assert row["recguide_over_vanilla"] > 0 and row["recguide_over_best_fixed"] > 0
    traces = json.loads((out / "traces.json").read_text())["requests"]
    assert traces and all(len(r) == 4 for t in traces for r in t["rounds"])


def test_a_sweep_with_failed_requests_exits_nonzero(ckpt, tmp_path, monkeypatch, capsys):
    from recguide_trt.runtime.policies.linearspec import LinearSpecPolicy

    def broken(self, request, outcome, hit, would_hit=None):
        raise RuntimeError("policy bug")

    monkeypatch.setattr(LinearSpecPolicy, "observe", broken)
    monkeypatch.setenv("RECGUIDE_CACHE", str(tmp_path / "cache"))
    args = add_bench_args(argparse.ArgumentParser()).parse_args([
        "--model", str(ckpt), "--workload", "random", "--concurrency", "1", "--policies", "ar,linearspec",
        "--blocks", "2", "--requests", "1", "--max-tokens", "4", "--ignore-eos", "--num-prompts", "4",
        "--no-progress", "--no-plots", "--out", str(tmp_path / "out")])
    assert run_bench(args) == 1
    err = capsys.readouterr().err
    assert "FAILED" in err and "'linearspec-L2 C=1': 2" in err and "'ar C=1'" not in err


class _Counting:
    """Wraps an engine and records the in-flight count (submitted, not finished) before each step."""

    def __init__(self, engine):
        self.engine, self.seen, self.reqs = engine, [], []

    def submit(self, ids, params, on_tokens=None):
        r = self.engine.submit(ids, params, on_tokens)
        self.reqs.append(r)
        return r

    def step(self):
        self.seen.append(sum(not r.done for r in self.reqs))
        self.engine.step()

    def cancel(self, rid):
        self.engine.cancel(rid)

    def has_work(self):
        return self.engine.has_work()


def test_closed_loop_keeps_exactly_c_in_flight(ckpt):
    from recguide_trt import LLM

    llm = LLM(model=str(ckpt), max_num_seqs=4)
    target = _Counting(llm.engine)
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    res = run_cell(target, prompts, lambda n: SamplingParams(max_tokens=n, policy="ar", stop_at_eos=False),
                   3, 5, 6)
    assert res.metrics["requests"] == 5 and res.inflight == {"min": 3, "max": 3}
    # Every step up to the last measured finish saw exactly C requests in flight; the one step after
    # it only retires the cancelled fillers.
    assert len(target.seen) > 5 and all(n == 3 for n in target.seen[:-1]), str(target.seen)
    cancelled = [r for r in target.reqs if r.finish_reason == "cancelled"]
    assert all(res.kinds[r.id] == "filler" for r in cancelled) and len(cancelled) == target.seen[-1]
    assert sum(k == "warmup" for k in res.kinds.values()) == 3
    assert not llm.engine.has_work()


def test_repeats_balance_policies_and_pool_cells(ckpt, monkeypatch):
    from recguide_trt import LLM
    from recguide_trt.bench import sweep

    llm = LLM(model=str(ckpt), max_num_seqs=2)
    order = []
    real = sweep.run_cell

    def spy(engine, prompts, make_params, C, n, max_tokens, label, *a, **k):
        order.append(label)
        return real(engine, prompts, make_params, C, n, max_tokens, label, *a, **k)

    monkeypatch.setattr(sweep, "run_cell", spy)
    specs = [sweep.PolicySpec("ar", "ar"), sweep.PolicySpec("linearspec-L2", "linearspec", 2)]
    res = sweep.run_sweep(llm, [[5, 6, 7], [8, 9]], specs, [2], n_requests=2, max_tokens=6, ignore_eos=True,
                          progress=False, repeats=3)
    assert order == ["ar", "linearspec-L2", "linearspec-L2", "ar", "ar", "linearspec-L2"]
    assert [c["policy"] for c in res["cells"]] == ["ar", "linearspec-L2"]
    for cell in res["cells"]:
        assert cell["metrics"]["requests"] == 3 * 4 and cell["metrics"]["output_tokens"] == 3 * 4 * 6
        tp = cell["throughput"]
        assert len(tp["repeats"]) == 3 and tp["output_tok_s"] == pytest.approx(tp["tokens"] / tp["window_s"])
        assert min(tp["repeats"]) <= tp["output_tok_s"] <= max(tp["repeats"])
        assert cell["engine"]["concurrency_hist"] == {2: cell["engine"]["steps"]}
    with pytest.raises(ValueError, match="repeats"):
        sweep.run_sweep(llm, [[5, 6]], specs, [1], repeats=0, progress=False)


def test_interleave_request_takes_turns_by_request_at_c1(ckpt, monkeypatch):
    """--interleave request: at C = 1 each round is the same prompt once per policy, the order balanced, after one
    unmeasured warm-up request per policy; the rounds are the pooled repeats. C > 1 still runs cells."""
    from recguide_trt import LLM
    from recguide_trt.bench import sweep

    llm = LLM(model=str(ckpt), max_num_seqs=2)
    calls = []
    real = sweep.run_cell

    def spy(engine, prompts, make_params, C, n, max_tokens, label, *a, **k):
        calls.append((C, label, [list(p) for p in prompts], n))
        return real(engine, prompts, make_params, C, n, max_tokens, label, *a, **k)

    monkeypatch.setattr(sweep, "run_cell", spy)
    specs = [sweep.PolicySpec("ar", "ar"), sweep.PolicySpec("linearspec-L2", "linearspec", 2)]
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12], [13, 14]]
    res = sweep.run_sweep(llm, prompts, specs, [1, 2], n_requests=2, max_tokens=5, ignore_eos=True,
                          progress=False, repeats=2, traces=True, interleave="request")
    c1 = [c for c in calls if c[0] == 1]
    assert [(label, p) for _, label, p, _ in c1[:2]] == [("ar", [prompts[0]]), ("linearspec-L2", [prompts[0]])]
    rounds = c1[2:]
    assert all(n == 1 for *_, n in rounds) and len(rounds) == 2 * 2 * 2
    assert [label for _, label, _, _ in rounds] == ["ar", "linearspec-L2", "linearspec-L2", "ar"] * 2
    assert [p for _, _, p, _ in rounds][::2] == [[prompts[1]], [prompts[2]], [prompts[1]], [prompts[2]]]
    assert all(rounds[i][2] == rounds[i + 1][2] for i in range(0, len(rounds), 2))  # one prompt per round
    c2 = [c for c in calls if c[0] == 2]
    assert [label for _, label, _, _ in c2] == ["ar", "linearspec-L2", "linearspec-L2", "ar"]  # cells, balanced
    for cell in res["cells"]:
        if cell["C"] == 1:
            assert cell["metrics"]["requests"] == 4 and cell["metrics"]["output_tokens"] == 4 * 5
            assert len(cell["throughput"]["repeats"]) == 4
    traced = {(t["policy"], t["prompt"]) for t in res["traces"] if t["C"] == 1}
    assert traced == {(s.label, i) for s in specs for i in (1, 2)}
    with pytest.raises(ValueError, match="interleave"):
        sweep.run_sweep(llm, prompts, specs, [1], progress=False, interleave="token")


@pytest.mark.parametrize("n", range(1, 10))
def test_balanced_orders_place_and_follow_equally_often(n):
    from collections import Counter

    from recguide_trt.bench.sweep import balanced_orders

    rows = balanced_orders(n)
    assert len(rows) == (n if n % 2 == 0 else 2 * n) and all(sorted(r) == list(range(n)) for r in rows)
    assert rows[0] == list(range(n))                          # one round runs the policies in the order given
    places = Counter((place, x) for r in rows for place, x in enumerate(r))
    assert set(places.values()) == {len(rows) // n}           # every item in every place equally often
    follows = Counter((a, b) for r in rows for a, b in zip(r, r[1:]))
    if n > 1:
        assert len(follows) == n * (n - 1) and len(set(follows.values())) == 1   # behind each other equally often


def test_interleave_request_through_the_console_script(ckpt, tmp_path):
    """`recguide bench --interleave request` as a user runs it: per-round ratios in the table and on stdout."""
    out = tmp_path / "out"
    r = recguide_bench("--model", ckpt, "--workload", "random", "--concurrency", "1", "--policies",
                       "ar,linearspec,recguide", "--blocks", "2", "--requests", "2", "--max-tokens", "6", "--ignore-eos",
                       "--num-prompts", "4", "--interleave", "request", "--no-progress", "--no-plots", "--recguide",
                       "switch_concurrency=0", "--recguide", "lookup=no", "--recguide", "hysteresis=0.5", "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    table = (out / "table.md").read_text()
    assert "paired per repeat" in r.stdout and "per repeat: median (min–max)" in table
    assert "switch_concurrency=0, lookup=no, hysteresis=0.5 (--recguide)" in table
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["interleave"] == "request"
    assert all(len(c["throughput"]["repeats"]) == 2 for c in res["cells"])
    # The overrides reached the engine's policy: the adaptive mode only, no lookups.
    rg = res["config"]["recguide_config"]
    assert (rg["switch_concurrency"], rg["lookup"], rg["hysteresis"]) == (0, False, 0.5)
    (cell,) = [c for c in res["cells"] if c["policy"] == "recguide"]
    assert cell["engine"]["recguide_mode_steps"].get("overlap", 0) == 0
    assert sum(cell["engine"]["recguide_mode_steps"].values()) > 0
    for override, message in (("foo=1", "--recguide: unknown field 'foo'; fields: candidate_blocks"),
                              ("lookup=maybe", "--recguide lookup: expected true or false, got 'maybe'"),
                              ("hysteresis=0.9", "hysteresis must be in [0, 0.5]")):
        bad = recguide_bench("--model", ckpt, "--recguide", override, "--out", out, timeout=300)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr, (override, bad.stderr)
    bad = recguide_bench("--model", ckpt, "--interleave", "request", "--openai", "http://127.0.0.1:9", "--out", out,
                         timeout=300)
    assert bad.returncode != 0 and "--interleave request runs in-process only" in bad.stderr


def test_max_block_size_sets_the_engine_and_the_fixed_blocks(ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("RECGUIDE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    base = ["--model", str(ckpt), "--workload", "random", "--concurrency", "1", "--policies", "linearspec",
            "--requests", "1", "--max-tokens", "4", "--ignore-eos", "--num-prompts", "2", "--no-progress",
            "--no-plots", "--out", str(out)]
    args = add_bench_args(argparse.ArgumentParser()).parse_args(base + ["--max-block-size", "16"])
    assert run_bench(args) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["environment"]["engine_max_block"] == 16       # the model's default would give 8
    # every block of RecGuide's grid up to 16: the "best fixed" oracle is over RecGuide's own choices
    assert res["policies"] == [f"linearspec-L{b}" for b in (2, 3, 4, 6, 8, 12, 16)]
    bad = add_bench_args(argparse.ArgumentParser()).parse_args(base + ["--max-block-size", "1"])
    with pytest.raises(SystemExit, match="max-block-size must be >= 2"):
        run_bench(bad)
    bad = add_bench_args(argparse.ArgumentParser()).parse_args(base + ["--cost-past-len", "0"])
    with pytest.raises(SystemExit, match="cost-past-len must be >= 1"):
        run_bench(bad)


def test_typical_context_is_the_median_prompt_plus_half_the_output():
    assert typical_context([[1] * 10, [1] * 30, [1] * 20], max_tokens=64) == 20 + 32
    assert typical_context([], max_tokens=8) == 4
