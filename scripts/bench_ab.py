#!/usr/bin/env python
"""Two versions of RecGuide against each other: ``recguide bench`` runs of two arms, alternating.

An arm is a source tree (the working tree, or a git revision checked out as a worktree) and extra ``recguide bench``
options (``--recguide switch_concurrency=0``, ...). Each arm runs the same bench ``--runs`` times, the arms taking
turns and swapping which goes first each run (a b, b a, a b, ...), every run in a fresh process. A shared host drifts
by more between minutes than a policy change moves, so what is compared is each run's own ratio of RecGuide (or
``--subject``) to every other policy of the same run (its AR, its ``lookup``, ...): per C, each arm's mean of them
and the pairs of consecutive runs in which arm b is ahead.

    python scripts/bench_ab.py --a-rev HEAD~1 --runs 4 --out /tmp/ab -- --model smollm2-135m \\
        --compute-dtype bfloat16 --kv-cache-dtype bfloat16 --workload chat-code --max-tokens 96 --requests 8 \\
        --interleave request --policies ar,lookup,recguide --concurrency 1,2 --repeats 2

writes ``a-1 … b-R`` (each run's ``recguide bench`` output and log), ``summary.md`` and ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("a", "b")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                usage="%(prog)s [options] -- RECGUIDE-BENCH-OPTIONS ...")
    for arm in ARMS:
        p.add_argument(f"--{arm}-rev", default=None, metavar="REV",
                       help=f"git revision arm {arm} runs (a temporary worktree; default: the working tree)")
        p.add_argument(f"--{arm}-args", default="", metavar="OPTIONS",
                       help=f"extra recguide bench options of arm {arm}, one shell-quoted string")
    p.add_argument("--runs", type=int, default=4, help="runs per arm (default 4)")
    p.add_argument("--subject", default="recguide", help="the policy whose ratios are compared (default recguide)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("bench", nargs=argparse.REMAINDER, help="after --: the options both arms' recguide bench take")
    a = p.parse_args(argv)
    if a.runs < 1:
        p.error(f"--runs must be >= 1, got {a.runs}")
    a.bench = a.bench[1:] if a.bench[:1] == ["--"] else a.bench
    a.out = a.out.resolve()   # each run's recguide bench works in its arm's source tree
    if any(x == "--out" or x.startswith("--out=") for x in a.bench):
        p.error("--out after -- : each run's output directory is set by this script (give --out before --)")
    for arm in ARMS:
        try:
            setattr(a, f"{arm}_args", shlex.split(getattr(a, f"{arm}_args")))
        except ValueError as exc:
            p.error(f"--{arm}-args: {exc}")
    return a


def order(run: int) -> tuple[str, ...]:
    """The arms' order in run ``run`` (0-based): a b, then b a, alternating."""
    return ARMS if run % 2 == 0 else ARMS[::-1]


def checkout(rev: str, path: Path) -> Path:
    """``rev`` as a detached worktree at ``path``."""
    r = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(path), rev],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"bench_ab: cannot check out {rev!r}: {r.stderr.strip().splitlines()[-1:] or r.returncode}")
    return path


def run_bench(source: Path, options: list[str], out: Path) -> None:
    """One ``recguide bench`` run of ``source``'s package (its directory first on the path), logged beside ``out``."""
    log = out.with_suffix(".log")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(source), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    with open(log, "w") as f:
        r = subprocess.run([sys.executable, "-m", "recguide_trt.cli", "bench", *options, "--no-progress", "--out",
                            str(out)], cwd=source, env=env, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        tail = log.read_text().strip().splitlines()[-3:]
        raise SystemExit(f"bench_ab: {out.name} failed (exit {r.returncode}; {log}):\n" + "\n".join(tail))


def run_ratios(results: dict, subject: str) -> dict[int, dict[str, float]]:
    """Per C: the subject's tok/s over every other policy's, in one ``recguide bench`` results.json."""
    cells = {(c["policy"], c["C"]): c["throughput"]["output_tok_s"] for c in results["cells"]}
    out: dict[int, dict[str, float]] = {}
    for (policy, C), tok_s in sorted(cells.items(), key=lambda kv: kv[0][1]):
        mine = cells.get((subject, C))
        if policy != subject and mine and tok_s:
            out.setdefault(C, {})[policy] = mine / tok_s
    return out


def summarise(ratios: dict[str, list[dict[int, dict[str, float]]]]) -> list[dict]:
    """Rows per (C, reference policy): each arm's ratios by run, their means, b's mean over a's, and in how many
    runs b's ratio is above a's (run i of b against run i of a: the two ran back to back)."""
    rows = []
    first = ratios[ARMS[0]][0]
    for C in sorted(first):
        for ref in first[C]:
            per = {arm: [r[C][ref] for r in ratios[arm] if ref in r.get(C, {})] for arm in ARMS}
            if not all(per.values()):
                continue
            mean = {arm: statistics.mean(v) for arm, v in per.items()}
            ahead = sum(b > a for a, b in zip(per["a"], per["b"]))
            rows.append({"C": C, "reference": ref, "a": per["a"], "b": per["b"], "a_mean": mean["a"],
                         "b_mean": mean["b"], "b_over_a": mean["b"] / mean["a"], "b_ahead": ahead,
                         "pairs": min(len(per["a"]), len(per["b"]))})
    return rows


def markdown(rows: list[dict], subject: str, arms: dict[str, str]) -> str:
    lines = [f"# {subject}: arm a against arm b", "", *(f"- {arm}: {desc}" for arm, desc in arms.items()), "",
             f"| C | {subject} / | a: mean (runs) | b: mean (runs) | b / a | b ahead |", "|---:|:---|---|---|---:|---:|"]
    for r in rows:
        runs = {arm: ", ".join(f"{x:.3f}" for x in r[arm]) for arm in ARMS}
        lines.append(f"| {r['C']} | {r['reference']} | {r['a_mean']:.3f} ({runs['a']}) | {r['b_mean']:.3f} "
                     f"({runs['b']}) | {r['b_over_a']:.3f} | {r['b_ahead']} of {r['pairs']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    sources, worktrees = {}, []
    tmp = Path(tempfile.mkdtemp(prefix="bench_ab-"))   # outside the repository: a worktree there is a nested checkout
    for arm in ARMS:
        rev = getattr(a, f"{arm}_rev")
        sources[arm] = checkout(rev, tmp / arm) if rev else ROOT
        if rev:
            worktrees.append(sources[arm])
    arms = {arm: f"{getattr(a, f'{arm}_rev') or 'the working tree'}"
                 f"{' ' + shlex.join(getattr(a, f'{arm}_args')) if getattr(a, f'{arm}_args') else ''}" for arm in ARMS}
    ratios: dict[str, list] = {arm: [] for arm in ARMS}
    try:
        for i in range(a.runs):
            for arm in order(i):
                out = a.out / f"{arm}-{i + 1}"
                print(f"bench_ab: run {i + 1}/{a.runs}, arm {arm} ({arms[arm]})", file=sys.stderr, flush=True)
                run_bench(sources[arm], [*a.bench, *getattr(a, f"{arm}_args")], out)
                ratios[arm].append(run_ratios(json.loads((out / "results.json").read_text()), a.subject))
    finally:
        for path in worktrees:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    rows = summarise(ratios)
    if not rows:
        raise SystemExit(f"bench_ab: no cell of {a.subject!r} beside another policy (add it to --policies)")
    text = markdown(rows, a.subject, arms)
    (a.out / "summary.md").write_text(text)
    (a.out / "summary.json").write_text(json.dumps({"arms": arms, "bench": a.bench, "subject": a.subject,
                                                    "rows": rows}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
