"""Step-time breakdown: every backend's split adds up to the measured steps; the script runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recguide_trt import LLM, EngineConfig
from recguide_trt.bench.breakdown import CATEGORIES, measure, shares, table
from tests.conftest import has_embedded

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not has_embedded(), reason="embedded model missing")


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_split_adds_up(backend, tmp_path):
    from tests.runtime.helpers import flat_cost_table

    llm = LLM("tiny", backend=backend, engine_config=EngineConfig(max_num_seqs=2, max_model_len=200,
                                                          cost_table=flat_cost_table()))
    prompts = [llm.encode("def add(a, b):\n"), llm.encode("import os\n")]
    rows = [measure(llm, policy, 2, prompts, 12, tmp_path, block) for policy, block in (("ar", None),
                                                                                         ("linearspec", 8))]
    for r in rows:
        assert r.steps > 0 and r.tokens > 0
        assert set(r.ms_per_step) == set(CATEGORIES)
        assert all(v >= 0 for v in r.ms_per_step.values()), r.ms_per_step
        total_ms = 1e3 * r.seconds / r.steps
        # The categories partition the measured decode time (timer granularity aside).
        assert sum(r.ms_per_step.values()) == pytest.approx(total_ms, rel=0.25)
        assert r.ms_per_step["projections + MLP"] > 0 and r.ms_per_step["attention"] > 0
    assert set(rows[0].forwards) == {"ar"} and rows[0].forwards["ar"] > 0
    assert rows[1].forwards["draft"] > 0 and rows[1].forwards["verify"] > 0
    text = table(rows) + shares(rows)
    assert text.count(f"| {backend} |") == 4


def test_script_writes_table_and_record(tmp_path):
    out = tmp_path / "bd.md"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "profile_breakdown.py"), "--model", "tiny", "--backends", "native",
                           "--scenarios", "ar,fused", "--concurrency", "1,2", "--max-tokens", "6", "--prompt-tokens",
                           "32", "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    md = out.read_text()
    assert "| native | fused | 2 |" in md and "Shares of the step" in md
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["machine"]["cores"] >= 1 and len(record["rows"]) == 4
    fused = [r for r in record["rows"] if r["policy"] == "fused"]
    assert all(r["forwards"].get("fused", 0) > 0 for r in fused)


@pytest.mark.parametrize("args,msg", [(["--concurrency", "0"], ">= 1"), (["--scenarios", "nope"], "unknown scenario"),
                                      (["--backends", "gpu9"], "unknown backend"), (["--max-tokens", "1"], ">= 2")])
def test_script_rejects_bad_options(args, msg):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "profile_breakdown.py"), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and msg in proc.stderr
