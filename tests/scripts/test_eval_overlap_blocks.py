"""scripts/eval_overlap_blocks.py through its command line: forced overlap per block, beside LinearSpec."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import has_embedded
from tests.scripts.runner import run_script

pytestmark = pytest.mark.skipif(not has_embedded(), reason="needs the embedded model")


def run(*args: str) -> subprocess.CompletedProcess:
    return run_script("eval_overlap_blocks.py", *args)


def test_reports_every_block_and_lossless_outputs(tmp_path):
    out = tmp_path / "ovl"
    p = run("--model", "tiny", "--workload", "humaneval", "--blocks", "2,4", "--prompts", "2",
            "--max-tokens", "16", "--out", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["policy"], r["block"]) for r in rows] == [("ar", 1), ("linearspec", 2), ("overlap", 2),
                                                         ("linearspec", 4), ("overlap", 4)]
    assert all(r["same_as_ar"] == 2 for r in rows)
    overlap = [r for r in rows if r["policy"] == "overlap"]
    assert all(r["forwards"].get("fused", 0) > 0 and r["hit_rate"] is not None for r in overlap)
    assert "| overlap | 4 |" in (out / "table.md").read_text()


def test_bad_blocks_name_the_flag(tmp_path):
    p = run("--model", "tiny", "--blocks", "1,4", "--out", str(tmp_path))
    assert p.returncode != 0 and "--blocks" in p.stderr and "Traceback" not in p.stderr
