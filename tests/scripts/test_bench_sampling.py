"""scripts/bench_sampling.py as a user runs it (a subprocess), on the embedded stand-in."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import has_embedded
from tests.scripts.runner import run_script

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess:
    return run_script("bench_sampling.py", *args)


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
def test_table(tmp_path):
    r = run("--model", "tiny", "--policies", "ar,linearspec", "--serial-prompts", "1", "--batch", "2",
            "--max-tokens", "6", "--rounds", "1", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert [(row["case"], row["policy"]) for row in res["rows"]] == [
        ("batch 1", "ar"), ("batch 1", "linearspec"), ("batch 2", "ar"), ("batch 2", "linearspec")]
    assert all(row["tok_s_sampled"] > 0 and row["mal_greedy"] >= 1 for row in res["rows"])
    assert "| batch 2 | linearspec |" in (tmp_path / "table.md").read_text()


@pytest.mark.parametrize("args, message", [
    (["--policies", "medusa"], "--policies: unknown ['medusa']"),
    (["--temperature", "0"], "--temperature must be > 0"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
])
def test_bad_arguments_are_one_clear_line(args, message):
    r = run("--model", "tiny", *args)
    assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr
