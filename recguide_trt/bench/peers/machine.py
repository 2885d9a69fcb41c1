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


# (vendor, family, model) -> core, for the CPUs this project's machines have shown or are likely to:
# a virtual machine often names its CPU only "AMD EPYC", and hosts of that one name differed 4x in FMA
# rate (a 2 GHz Zen 1 with 128-bit FMA pipes beside Zen 3s), so every record carries family and model.
_CORES = {("AuthenticAMD", 23, 1): "Zen 1", ("AuthenticAMD", 23, 8): "Zen+", ("AuthenticAMD", 23, 49): "Zen 2",
          ("AuthenticAMD", 25, 1): "Zen 3", ("AuthenticAMD", 25, 17): "Zen 4", ("AuthenticAMD", 25, 160): "Zen 4c",
          ("AuthenticAMD", 26, 2): "Zen 5", ("AuthenticAMD", 26, 17): "Zen 5",
          ("GenuineIntel", 6, 85): "Skylake-SP / Cascade Lake", ("GenuineIntel", 6, 106): "Ice Lake-SP",
          ("GenuineIntel", 6, 143): "Sapphire Rapids", ("GenuineIntel", 6, 207): "Emerald Rapids",
          ("GenuineIntel", 6, 173): "Granite Rapids"}


def first_processor(cpuinfo: str) -> dict[str, str]:
    """The fields of the first processor's block of a ``/proc/cpuinfo`` text (the others repeat them)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def describe_cpu(cpuinfo: str) -> str | None:
    """``model name [family F model M: core]`` from the first processor of a ``/proc/cpuinfo`` text."""
    fields = first_processor(cpuinfo)
    name = fields.get("model name")
    if name is None:
        return None
    try:
        family, model = int(fields["cpu family"]), int(fields["model"])
    except (KeyError, ValueError):
        return name
    core = _CORES.get((fields.get("vendor_id", ""), family, model))
    return f"{name} [family {family} model {model}{': ' + core if core else ''}]"


def cpu_model() -> str:
    """The CPU: model name, family and model (``/proc/cpuinfo``, else ``lscpu``, else ``platform``)."""
    try:
        described = describe_cpu(Path("/proc/cpuinfo").read_text())
        if described:
            return described
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
    """Which of :data:`FLAGS` this CPU has."""
    try:
        have = set(first_processor(Path("/proc/cpuinfo").read_text()).get("flags", "").split())
    except OSError:
        return []
    return [f for f in FLAGS if f in have]


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
