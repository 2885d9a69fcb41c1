"""``recguide bench`` through the console script, as a user runs it."""

from __future__ import annotations

import os
import subprocess

from tests.serving.openai_server import recguide_command


def recguide_bench(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    """``recguide bench ARGS`` in a subprocess, output captured. It keeps the session's cache: a fresh one would build
    the native kernel again (~50 s)."""
    return subprocess.run([*recguide_command(), "bench", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))
