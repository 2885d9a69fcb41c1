"""Compare `recguide train-drafter` runs that differ in one lever: held-out MAL at the start and end of each.

Each run is ``NAME=DIR``, DIR holding the ``training_report.json`` that train-drafter writes. The first
run (or ``--baseline``) is the control; every other run's final teacher-forced MAL is given as a
difference from it. Runs are comparable only if they share the starting point, the data, the seed and
the number of steps: the script says which of those differ.

    python scripts/compare_drafter_runs.py control=docs/drafter/levers/control kl=docs/drafter/levers/kl \\
        prefix=docs/drafter/levers/prefix --out docs/drafter/levers.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from recguide_trt.training.config import describe_loss

# What must match for two runs' MAL to differ by their lever only.
SAME = ("init", "prompts", "seed", "lr", "blocks", "rank", "alpha", "targets", "seqs_per_step")


def load(spec: str) -> tuple[str, dict]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"run {spec!r}: expected NAME=DIR")
    report = Path(path) / "training_report.json"
    if not report.is_file():
        raise ValueError(f"run {name}: {report} does not exist (is {path} a train-drafter --out directory?)")
    try:
        data = json.loads(report.read_text())
        data["history"][0], data["config"]["blocks"]  # noqa: B018  (the fields this script reads)
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"run {name}: {report} is not a train-drafter report ({exc!r})") from None
    return name, data


def table(runs: list[tuple[str, dict]], baseline: str) -> str:
    base = dict(runs)[baseline]
    blocks = base["config"]["blocks"]
    lines = ["| run | loss | steps (sequences) | train min | "
             + " | ".join(f"MAL@{b} start → end" for b in blocks) + " | "
             + " | ".join(f"Δ@{b} vs {baseline}" for b in blocks) + " |",
             "|---|---|---:|---:|" + "---:|" * (2 * len(blocks))]
    for name, r in runs:
        first, last = r["history"][0], r["history"][-1]
        cells = [f"{first.get(f'tf_mal@{b}', float('nan')):.3f} → {last.get(f'tf_mal@{b}', float('nan')):.3f}"
                 for b in blocks]
        deltas = [f"{last.get(f'tf_mal@{b}', float('nan')) - base['history'][-1].get(f'tf_mal@{b}', float('nan')):+.3f}"
                  if name != baseline else "—" for b in blocks]
        lines.append(f"| {name} | {describe_loss(r['config'].get('loss') or {})} | {r['steps_done']} ({r['seqs_seen']}) | {r['train_minutes']} | "
                     + " | ".join(cells) + " | " + " | ".join(deltas) + " |")
    notes = []
    for name, r in runs:
        differ = [k for k in SAME if r["config"].get(k) != base["config"].get(k)]
        if r["steps_done"] != base["steps_done"]:
            differ.append("steps done")
        if differ and name != baseline:
            notes.append(f"- **{name} is not comparable with {baseline}**: {', '.join(differ)} differ.")
    machines = sorted({f"{r['cpu']} ({r['threads']} thread{'s' if r['threads'] != 1 else ''} per run, "
                       f"bf16 autocast {r['autocast_bf16']})" for _, r in runs})
    notes.append(f"- Machine: {'; '.join(machines)}. Held-out: {base['heldout_prompts']} prompts, teacher-forced "
                 "MAL = 2 + the leading draft positions greedy verification would accept, every block.")
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="NAME=DIR, DIR holding training_report.json")
    ap.add_argument("--baseline", help="the control run's NAME (default: the first)")
    ap.add_argument("--out", type=Path, help="also write the table to this Markdown file")
    args = ap.parse_args(argv)
    try:
        runs = [load(s) for s in args.runs]
        names = [n for n, _ in runs]
        if len(set(names)) != len(names):
            raise ValueError(f"run names must be unique, got {names}")
        baseline = args.baseline or names[0]
        if baseline not in names:
            raise ValueError(f"--baseline {baseline!r} is not one of the runs {names}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = table(runs, baseline)
    print(text, end="")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
