#!/usr/bin/env python
"""Run a command while another tenant loads one core in bursts (a shared CPU's neighbour).

    python scripts/bench_under_load.py [--busy 3] [--idle 5] [--cores 1] -- COMMAND ...

A child process per ``--cores`` spins for ``--busy`` seconds, sleeps ``--idle`` seconds, and again,
until COMMAND exits; then they are stopped, and this script exits with COMMAND's status. What it is
for: `recguide bench` under such a load, where every step of every policy slows while a burst
lasts (the cost refit must not mistake a burst for what one step shape costs; docs/drafter.md, "RecGuide's
cost refit under a neighbour's load").
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import subprocess
import sys
import time


def _tenant(busy: float, idle: float) -> None:
    while True:
        t = time.monotonic()
        while time.monotonic() - t < busy:
            pass
        time.sleep(idle)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--busy", type=float, default=3.0, help="seconds each burst keeps a core busy (default 3)")
    p.add_argument("--idle", type=float, default=5.0, help="seconds between bursts (default 5)")
    p.add_argument("--cores", type=int, default=1, help="cores loaded at once (default 1)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command given (put it after --)")
    if args.busy <= 0 or args.idle < 0 or args.cores < 1:
        p.error("--busy must be > 0, --idle >= 0 and --cores >= 1")
    tenants = [mp.Process(target=_tenant, args=(args.busy, args.idle), daemon=True) for _ in range(args.cores)]
    for t in tenants:
        t.start()
    try:
        return subprocess.call(command)
    except FileNotFoundError:
        print(f"bench_under_load: command not found: {command[0]}", file=sys.stderr)
        return 127
    finally:
        for t in tenants:
            t.terminate()
            t.join()


if __name__ == "__main__":
    sys.exit(main())
