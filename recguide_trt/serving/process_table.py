"""Live processes of a process group or a session, read from /proc (no ``ps`` parsing).

What the servers and the tests' Ray clusters use to find everything they started — and only that —
when they stop (other sessions' servers on the same machine are left alone).
"""

from __future__ import annotations

from pathlib import Path


def pids_in(*, pgrp: int | None = None, session: int | None = None) -> list[int]:
    """PIDs of the non-zombie processes in process group ``pgrp`` or session ``session``."""
    if (pgrp is None) == (session is None):
        raise ValueError("give exactly one of pgrp and session")
    field, value = (2, pgrp) if pgrp is not None else (3, session)   # stat after "(comm)": state ppid pgrp session
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[field]) == value and fields[0] != "Z":
            out.append(int(entry.name))
    return out
