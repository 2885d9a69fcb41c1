"""Run a script of ``scripts/`` as a user does: in its own process, with the repository importable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_script(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python scripts/<name> *args``, its output captured as text."""
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})
