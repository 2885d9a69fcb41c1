"""The machine record written next to a run's results: what it ran on and how it was started."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
"""CPU flags that decide which kernels the engines pick."""


def cpu_model() -> str:
    """The CPU model name (``/proc/cpuinfo``, else ``lscpu``, else ``platform``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in FLAGS if f in have]
    except OSError:
        pass
    return []


def git_commit(repo: Path) -> str | None:
    """HEAD of the repository, with ``-dirty`` when the work tree has changes."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (head + ("-dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def record_start(repo: Path, argv: list[str] | None = None, env_keys: tuple[str, ...] = ("PEERS_SPIN",)) -> dict:
    """Everything known before the run: CPU, cores, load, versions, date, the exact command line."""
    import torch

    argv = sys.argv if argv is None else argv
    env = {k: os.environ[k] for k in env_keys if k in os.environ}
    return {
        "command": " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.quote(a) for a in argv]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "cpu": cpu_model(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "loadavg_start": list(os.getloadavg()), "host": platform.node(), "os": platform.platform(),
        "python": platform.python_version(), "torch": torch.__version__, "git_commit": git_commit(repo),
    }


def record_end(rec: dict, results: dict) -> dict:
    """Add the load at the end and each engine's package versions (as its worker reported them)."""
    rec = dict(rec, loadavg_end=list(os.getloadavg()))
    rec["engines"] = {lb: {"python": r.get("python"), **r.get("info", {})} for lb, r in results["rows"].items()}
    return rec


def machine_line(rec: dict) -> str:
    """One Markdown line naming the machine and its load, for the top of the table."""
    la0, la1 = rec.get("loadavg_start", [0])[0], rec.get("loadavg_end", [0])[0]
    flags = ", ".join(rec.get("cpu_flags", [])) or "no AVX flags read"
    return (f"{rec['cpu']} ({flags}), {rec['cores_usable']} usable of {rec['cores']} cores, load average "
            f"{la0:.2f} at start / {la1:.2f} at end; torch {rec['torch']}; {rec['date']}; "
            f"commit {rec.get('git_commit') or 'unknown'}")
