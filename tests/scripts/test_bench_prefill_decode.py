"""scripts/bench_prefill_decode.py as a user runs it (a subprocess), on the embedded stand-in."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.scripts.runner import run_script


def run(*args: str) -> subprocess.CompletedProcess:
    return run_script("bench_prefill_decode.py", *args, timeout=300)


@pytest.mark.timeout(300)
def test_splits_prefill_from_decode_with_the_native_phases(tmp_path):
    r = run("--model", "tiny", "--prompts", "3", "--tokens", "6", "--rounds", "1", "--prompt-tokens", "48",
            "--workload", "mixed", "--snippet-chars", "600", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["prompts"] == 3 and res["new_tokens"] == 6 and res["prompt_tokens"] > 3
    assert res["decode_s"] == pytest.approx(res["total_s"] - res["prefill_s"], abs=2e-3)
    # Two timings of a few milliseconds each (the stand-in, 6 tokens, one round): on a loaded host the
    # prefill-only run can take longer than the full one (CI: 0.012 s against 0.011 s), and the record
    # rounds them to the millisecond, so only their signs are checked, not their order or ratio.
    assert res["prefill_s"] > 0 and res["total_s"] > 0 and res["prefill_share"] > 0
    assert {"attention", "mlp", "qkv_proj", "head"} <= set(res["phases"])
    assert res["phases"]["mlp"]["prefill_s"] > 0
    table = (tmp_path / "table.md").read_text()
    assert "| prefill s | decode s |" in table and "| attention |" in table


def test_bad_values_say_which_option():
    r = run("--tokens", "1")
    assert r.returncode == 2 and "--tokens must be >= 2" in r.stderr
    r = run("--prompts", "0")
    assert r.returncode == 2 and "--prompts must be >= 1" in r.stderr
    r = run("--compute-dtype", "float16")
    assert r.returncode == 2 and "--compute-dtype" in r.stderr
