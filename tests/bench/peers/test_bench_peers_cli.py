"""scripts/bench_peers.py's command line, as a user runs it (no peers, nothing benchmarked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "bench_peers.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_help_lists_the_options():
    r = run("--help")
    assert r.returncode == 0, r.stderr
    for opt in ("--dir", "--out", "--rounds", "--serial-prompts", "--batch-prompts", "--tokens", "--spin",
                "--backends", "--peers"):
        assert opt in r.stdout


def test_bad_option_is_an_error():
    r = run("--no-such-option")
    assert r.returncode == 2 and "unrecognized arguments: --no-such-option" in r.stderr


def test_bad_values_say_what_to_change():
    r = run("--rounds", "0")
    assert r.returncode == 2 and "--rounds must be >= 1" in r.stderr
    r = run("--peers", "Nonesuch")
    assert r.returncode == 2 and "--peers: choose from" in r.stderr
