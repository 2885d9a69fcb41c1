#!/usr/bin/env python
"""Tune the trtllm-schedule controller's draft_len_schedule on training-split prompts.

Runs the bench's closed-loop sweep of AR and every fixed block (``--policies ar,linearspec``) on
``--workload stdlib-train`` (snippets of the files the embedded model was trained on, never a
benchmark prompt), keeps the fastest fixed policy's draft length per concurrency and writes
``--schedule-out`` (default docs/bench/draft_len_schedule.json), which ``recguide bench`` reads.
Takes every option of ``recguide bench``. Example::

    python scripts/calibrate_draft_len_schedule.py --repeats 3 --requests 8
"""

import argparse
import json
import sys
from pathlib import Path

from recguide_trt.bench import schedule_calibration
from recguide_trt.bench.schedule_calibration import (
    BENCHMARK_WORKLOADS,
    DEFAULT_SCHEDULE,
    schedule_from_summary,
    write_schedule,
)
from recguide_trt.bench.sweep import add_bench_args, run_bench


def main(argv: list[str] | None = None) -> int:
    """``scripts/calibrate_draft_len_schedule.py``: the calibration sweep, then the schedule file."""
    parser = add_bench_args(argparse.ArgumentParser(description=schedule_calibration.__doc__.split("\n")[0]))
    parser.set_defaults(policies="ar,linearspec", workload="stdlib-train", out=Path("results/calibrate-schedule"),
                        repeats=2)
    parser.add_argument("--schedule-out", type=Path, default=DEFAULT_SCHEDULE,
                        help=f"where to write the schedule (default {DEFAULT_SCHEDULE})")
    args = parser.parse_args(argv)
    if args.workload in BENCHMARK_WORKLOADS:
        parser.error(f"--workload {args.workload} holds the benchmark's prompts; calibrate on stdlib-train "
                     f"(or random)")
    policies = {p.strip() for p in args.policies.split(",") if p.strip()}
    if not policies <= {"ar", "linearspec"}:
        parser.error(f"--policies must be fixed policies (ar, linearspec), got {args.policies}")
    rc = run_bench(args)
    if rc != 0:
        return rc
    results = json.loads((args.out / "results.json").read_text())
    schedule = schedule_from_summary(results["summary"], results["policy_blocks"])
    env = results["environment"]
    write_schedule(args.schedule_out, schedule, {
        "command": env.get("command"), "date": env.get("date"), "cpu": env.get("cpu"), "backend": env.get("backend"),
        "git_commit": env.get("git_commit"), "workload": args.workload, "repeats": args.repeats,
        "best_fixed": {str(r["C"]): r["best_fixed"] for r in results["summary"]}})
    print(f"draft_len_schedule {schedule} -> {args.schedule_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
