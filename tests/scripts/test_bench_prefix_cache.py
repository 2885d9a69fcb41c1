"""scripts/bench_prefix_cache.py as a user runs it (a subprocess), on SmolLM2 kept small."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.scripts.runner import run_script


def run(*args: str) -> subprocess.CompletedProcess:
    return run_script("bench_prefix_cache.py", *args)


@pytest.mark.timeout(600)
def test_both_cases_reuse_prefixes_and_answer_identically(tmp_path):
    r = run("--questions", "2", "--turns", "2", "--system-chars", "400", "--max-tokens", "4", "--threads", "1",
            "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["mismatches"] == []
    system, chat = res["cases"]["shared system prompt"], res["cases"]["multi-turn chat"]
    assert system["requests"] == chat["requests"] == 1          # the first of each case fills the cache
    # The system message (~100 tokens of code and the template's header) is reused by every later request, and
    # a later chat turn reuses the earlier turns.
    assert system["cached_tokens"] > 80 and system["cached_tokens"] < system["prompt_tokens"]
    assert chat["cached_tokens"] > 20
    assert system["ttft_ms_cache"] > 0 and system["ttft_ms_no_cache"] > 0
    assert "| shared system prompt | 1 |" in (tmp_path / "table.md").read_text()


def test_bad_values_say_which_option():
    r = run("--turns", "0")
    assert r.returncode == 2 and "--turns must be >= 1" in r.stderr
    r = run("--model", "tiny", "--questions", "1", "--turns", "1")
    assert r.returncode != 0 and "has no chat template" in r.stderr
