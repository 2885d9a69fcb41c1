"""scripts/gpu_check.sh without a GPU: its arguments are checked, and it stops with a clear message
(exit 2) before any step when torch has no CUDA. The steps themselves run on a GPU only
(docs/gpu/h200-2026-12-04/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"


def run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "GPU_CHECK_OUT": str(tmp_path / "out")}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("args, message", [
    (["--only", "xyz"], "--only takes step letters a-f"),
    (["--only"], "--only takes step letters a-f"),
    (["--fast"], "unknown argument --fast"),
])
def test_bad_arguments_are_named(args, message, tmp_path):
    res = run(*args, tmp_path=tmp_path)
    assert res.returncode == 2 and message in res.stderr, res.stderr


def test_without_cuda_it_stops_before_any_step(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the steps would run")
    res = run("--quick", "--only", "e", tmp_path=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "torch with CUDA is required" in res.stderr
    assert "=== (e)" not in res.stdout
