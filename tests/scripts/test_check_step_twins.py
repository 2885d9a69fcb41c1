"""scripts/check_step_twins.py through its command line: identical AR cells on several engines, stepped in turns."""

from __future__ import annotations

import json

from recguide_trt.model import save_checkpoint
from tests.conftest import random_model, tiny_config
from tests.scripts.runner import run_script


def test_identical_cells_on_engines_in_turns(tmp_path):
    ckpt = tmp_path / "rand"
    save_checkpoint(random_model(tiny_config()), ckpt)
    out = tmp_path / "twins.json"
    p = run_script("check_step_twins.py", "--model", str(ckpt), "--workload", "random", "--concurrency", "2",
                   "--engines", "3", "--repeats", "2", "--requests", "2", "--max-tokens", "4", "--out", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "repeat 0: order [0, 1, 2]" in p.stdout and "repeat 1: order [2, 1, 0]" in p.stdout
    assert "identical AR cells, C = 2, 3 engines, 2 repeats: each engine / engine 0" in p.stdout
    rows = json.loads(out.read_text())["repeats"]
    assert len(rows) == 2
    for row in rows:
        assert row["ratio_to_engine0"][0] == 1.0 and all(t > 0 for t in row["tok_s"])
        assert all(r > 0 for r in row["ratio_to_engine0"]) and all(f > 0 for f in row["forward_s"])
    bad = run_script("check_step_twins.py", "--model", str(ckpt), "--engines", "1")
    assert bad.returncode == 2 and "--engines must be >= 2, got 1" in bad.stderr and "Traceback" not in bad.stderr
