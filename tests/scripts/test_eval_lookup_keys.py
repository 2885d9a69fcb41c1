"""scripts/eval_lookup_keys.py through its command line: lookup acceptance by key on real greedy continuations."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import has_embedded
from tests.scripts.runner import run_script

pytestmark = pytest.mark.skipif(not has_embedded(), reason="needs the embedded model")


def run(*args: str) -> subprocess.CompletedProcess:
    return run_script("eval_lookup_keys.py", *args)


def test_tallies_both_occurrence_choices_on_the_same_positions(tmp_path):
    out = tmp_path / "keys"
    p = run("--model", "tiny", "--workload", "humaneval", "--prompts", "3", "--max-tokens", "24", "--k", "4",
            "--compute-dtype", "float32", "--kv-cache-dtype", "float32", "--out", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    result = json.loads((out / "results.json").read_text())["result"]
    latest, furthest = result["latest"], result["furthest"]
    assert latest["all"]["positions"] == furthest["all"]["positions"] > 0  # same positions, either choice finds one
    bins = [r for key, r in furthest.items() if key.startswith("agree")]
    assert sum(r["positions"] for r in bins) == furthest["all"]["positions"]
    assert all(0 <= r["mean_accepted"] <= 4 for rows in result.values() for r in rows.values())
    assert "| furthest | all |" in (out / "table.md").read_text()
    assert set(json.loads((out / "results.json").read_text())["lookup_us"]) == {"latest", "furthest"}


def test_bad_values_name_the_flag(tmp_path):
    p = run("--k", "0", "--out", str(tmp_path))
    assert p.returncode != 0 and "--k" in p.stderr and "Traceback" not in p.stderr
    p = run("--model", "tiny", "--workload", "nope", "--out", str(tmp_path))
    assert p.returncode != 0 and "--workload" in p.stderr and "Traceback" not in p.stderr
