#!/usr/bin/env python
"""Whether one projection moved by more than another's seed spread (per C and policy).

Reads ``results.json`` files of ``scripts/simulate.py``: ``--seeds`` runs of one version (the
spread: min-max over seeds of every policy's tok/s and of RecGuide / best fixed) and ``--runs``
of another, and prints each figure's two ranges, flagging those that do not overlap (a move beyond
the seed spread). Example::

    python scripts/projection_spread.py --seeds old/s0/results.json old/s1/results.json old/s2/results.json \\
        --runs new/s0/results.json new/s1/results.json new/s2/results.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def figures(path: Path) -> dict[tuple[int, str], float]:
    data = json.loads(Path(path).read_text())
    out = {}
    for row in data["summary"]:
        for label, v in row["tok_s"].items():
            if v is not None:
                out[(row["C"], label)] = v
        if row.get("recguide_over_best_fixed") is not None:
            out[(row["C"], "RecGuide / best fixed")] = row["recguide_over_best_fixed"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=Path, nargs="+", required=True, help="results.json of the reference, one per seed")
    p.add_argument("--runs", type=Path, nargs="+", required=True, help="results.json of the version to check")
    args = p.parse_args(argv)
    ref = [figures(f) for f in args.seeds]
    runs = [figures(f) for f in args.runs]
    keys = sorted(set.intersection(*(set(r) for r in ref + runs)), key=lambda k: (k[0], k[1]))
    moved = 0
    print("| C | figure | reference seeds min–max | checked runs | ranges overlap |")
    print("|---:|:---|---:|---:|:---|")
    for key in keys:
        lo, hi = min(r[key] for r in ref), max(r[key] for r in ref)
        vals = [r[key] for r in runs]
        tol = 1e-6 * max(abs(lo), abs(hi))   # deterministic cells (AR) differ in the last float digits
        overlap = min(vals) <= hi + tol and max(vals) >= lo - tol
        moved += not overlap
        fmt = (lambda v: f"{v:.3f}") if key[1].startswith("RecGuide") else (lambda v: f"{v:.1f}")
        print(f"| {key[0]} | {key[1]} | {fmt(lo)}–{fmt(hi)} | {', '.join(fmt(v) for v in vals)} | "
              f"{'yes' if overlap else 'NO'} |")
    print(f"\n{len(keys)} figures; {moved} moved beyond the seed spread (checked runs' range disjoint from the "
          f"reference seeds' range)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
