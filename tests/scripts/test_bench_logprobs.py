"""scripts/bench_logprobs.py as a user runs it (a subprocess), on the embedded stand-in."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import has_embedded
from tests.scripts.runner import run_script

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess:
    return run_script("bench_logprobs.py", *args)


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
def test_table_and_checks(tmp_path):
    r = run("--model", "tiny", "--policies", "ar,linearspec", "--serial-prompts", "2", "--batch", "3",
            "--max-tokens", "6", "--rounds", "2", "--logprobs", "2", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    table = (tmp_path / "table.md").read_text()
    assert "every policy's tokens and logprobs equal to ar's: yes" in table
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["problems"] == [] and res["asked"] == "logprobs=2"
    assert [(row["case"], row["policy"]) for row in res["rows"]] == [
        ("batch 1", "ar"), ("batch 1", "linearspec"), ("batch 3", "ar"), ("batch 3", "linearspec")]
    assert all(len(row["rounds_off"]) == len(row["rounds_on"]) == 2 for row in res["rows"])
    assert all(f"| {row['case']} | {row['policy']} |" in table for row in res["rows"])


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
def test_processors_mode(tmp_path):
    r = run("--model", "tiny", "--processors", "--policies", "ar,recguide", "--serial-prompts", "1", "--batch", "2",
            "--max-tokens", "6", "--rounds", "1", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["problems"] == [] and res["asked"] == "logit_bias={0: 0.0}" and len(res["rows"]) == 4
    assert "# The logits processors' path" in (tmp_path / "table.md").read_text()


@pytest.mark.parametrize("args, message", [
    (["--policies", "medusa"], "--policies: unknown ['medusa']"),
    (["--logprobs", "21"], "--logprobs must be in [0, 20]"),
    (["--rounds", "0"], "--rounds must be >= 1"),
])
def test_bad_arguments_are_one_clear_line(args, message):
    r = run("--model", "tiny", *args)
    assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr
