"""``scripts/check_cost_probe.py`` as docs/drafter.md runs it: the batch-1 cost table under a burst, both probe orders."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import has_embedded

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "scripts" / "check_cost_probe.py")


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
def test_tables_for_both_orders_against_the_reference():
    res = subprocess.run([sys.executable, SCRIPT, "--model", "tiny", "--runs", "1", "--burst-s", "0.2", "--hogs", "1",
                          "--reps", "1"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = re.findall(r"^\| (reference \(no burst\)|cells|passes) \|.*\| ([\d.]+) \| ([\d.]+) \|$", res.stdout, re.M)
    assert [r[0] for r in rows] == ["reference (no burst)", "cells", "passes"], res.stdout
    assert all(float(ar) > 0 and float(b8) > 0 for _, ar, b8 in rows), res.stdout
    assert re.search(r"Worst ratio to the reference: cells [\d.]+x, passes [\d.]+x", res.stdout), res.stdout


@pytest.mark.parametrize("args,message", [(["--runs", "0"], "--runs must be >= 1"),
                                          (["--burst-s", "-1"], "--burst-s must be > 0"),
                                          (["--reps", "0"], "--reps must be >= 1")])
def test_bad_values_say_which_option(args, message):
    res = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 2 and message in res.stderr, res.stderr[-1500:]
    assert "Traceback" not in res.stderr
