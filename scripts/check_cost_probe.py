"""How a burst of load at start-up skews RecGuide's step-cost table, in each probe order.

RecGuide prices its blocks with a table of forward times measured once, at first use, and cached.
This script measures the batch-1 row of that table (what `recguide generate` uses) on a model's
native backend: first a reference with nothing else running, then ``--runs`` times in each probe
order (``cells``: cell after cell, the order before; ``passes``: passes over the grid, the order
now) while ``--hogs`` busy processes hold the CPU for the first ``--burst-s`` seconds, as another
job or a first use's own disk writes may. It prints every table and its ratio to the reference
(1.00 = unskewed).

    python scripts/check_cost_probe.py --runs 3 --burst-s 0.5 --hogs 2
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

HOG = "import sys, time\nend = time.time() + float(sys.argv[1])\nwhile time.time() < end: pass\n"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a model name or a checkpoint directory")
    ap.add_argument("--runs", type=int, default=3, help="burst runs per probe order (default 3)")
    ap.add_argument("--burst-s", type=float, default=0.5, help="seconds the busy processes run (default 0.5)")
    ap.add_argument("--hogs", type=int, default=2, help="busy processes per burst (default 2: this machine's cores)")
    ap.add_argument("--reps", type=int, default=3, help="timed forwards per cell, as at start-up (default 3)")
    a = ap.parse_args(argv)
    for name, value, low in (("--runs", a.runs, 1), ("--hogs", a.hogs, 0), ("--reps", a.reps, 1)):
        if value < low:
            ap.error(f"{name} must be >= {low}, got {value}")
    if not a.burst_s > 0:
        ap.error(f"--burst-s must be > 0, got {a.burst_s}")

    from recguide_trt import LLM
    from recguide_trt.runtime.cost_model import measure_cost_table

    llm = LLM(a.model, backend="native", max_num_seqs=1)
    backend = llm.engine.backend
    load = os.getloadavg()[0]
    print(f"# Step-cost table under a burst of load: {a.model}, native backend, batch 1\n")
    print(f"`python scripts/check_cost_probe.py {' '.join(sys.argv[1:] if argv is None else argv)}`; "
          f"{cpu_name()}, {os.cpu_count()} CPUs, load average {load:.2f} at the start; "
          f"bursts: {a.hogs} busy processes for {a.burst_s} s from the table's first probe.\n")
    ref = measure_cost_table(backend, batches=(1,), reps=max(5, a.reps), progress=False)
    ms = lambda t: " | ".join(f"{x * 1e3:.1f}" for x in t.plain[0])  # noqa: E731
    print("| probe order | run | " + " | ".join(f"{t} tok ms" for t in ref.tokens) + " | AR x ref | 8 tok x ref |")
    print("|---|---:|" + "---:|" * (len(ref.tokens) + 2))
    i8 = ref.tokens.index(8) if 8 in ref.tokens else len(ref.tokens) - 1
    print(f"| reference (no burst) | – | {ms(ref)} | 1.00 | 1.00 |")
    worst = {}
    for run in range(a.runs):
        for order in ("cells", "passes"):
            hogs = [subprocess.Popen([sys.executable, "-c", HOG, str(a.burst_s)]) for _ in range(a.hogs)]
            time.sleep(0.05)  # the busy processes have started
            table = measure_cost_table(backend, batches=(1,), reps=a.reps, progress=False, order=order)
            for h in hogs:
                h.wait()
            r_ar, r_8 = table.plain[0][0] / ref.plain[0][0], table.plain[0][i8] / ref.plain[0][i8]
            worst[order] = max(worst.get(order, 0.0), r_ar, r_8)
            print(f"| {order} | {run + 1} | {ms(table)} | {r_ar:.2f} | {r_8:.2f} |")
    print(f"\nWorst ratio to the reference: cells {worst['cells']:.2f}x, passes {worst['passes']:.2f}x.")
    llm.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
