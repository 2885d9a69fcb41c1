"""scripts/bench_lookup_rows.py through its command line: a wider row beside AR rows, timed and priced."""

from __future__ import annotations

import json
import subprocess

import pytest

from recguide_trt.runtime.cost_model import CostTable
from tests.conftest import has_embedded
from tests.scripts.runner import run_script

pytestmark = pytest.mark.skipif(not has_embedded(), reason="needs the embedded model")


def run(*args: str) -> subprocess.CompletedProcess:
    return run_script("bench_lookup_rows.py", *args)


def test_every_batch_and_width_is_timed_and_priced(tmp_path):
    out = tmp_path / "rows"
    p = run("--model", "tiny", "--batches", "2,4", "--widths", "2,5", "--reps", "2", "--past", "16",
            "--dtype", "float32", "--out", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    record = json.loads((out / "results.json").read_text())
    rows = record["rows"]
    assert [(r["batch"], r["width"], r["tokens"]) for r in rows] == [(2, 2, 3), (2, 5, 6), (4, 2, 5), (4, 5, 8)]
    assert all(r["ms"] > 0 and r["measured_x_ar"] > 0 for r in rows)
    for r in rows:  # the price is the cost table's, from the uniform cells timed in the run
        cells = record["uniform_ms"][str(r["batch"])]
        table = CostTable([r["batch"]], [1, 2, 3, 4], [[cells[str(t)] for t in (1, 2, 3, 4)]])
        assert r["priced_x_ar"] == pytest.approx(table.step_time(r["batch"], r["tokens"] / r["batch"])
                                                 / table.step_time(r["batch"], 1))
    assert "| 4 | 5 | 8 |" in (out / "table.md").read_text()


@pytest.mark.parametrize("args, flag", [(["--batches", "1"], "--batches"), (["--widths", "x"], "--widths"),
                                        (["--reps", "0"], "--reps")])
def test_bad_values_name_the_flag(tmp_path, args, flag):
    p = run(*args, "--out", str(tmp_path))
    assert p.returncode != 0 and flag in p.stderr and "Traceback" not in p.stderr
