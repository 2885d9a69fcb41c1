#!/usr/bin/env python
"""What one wider row adds to a step of AR rows (a lookup verify beside them), measured against its price.

RecGuide prices a packed step of B rows by their mean width, interpolated in log(tokens) between the cost table's
uniform cells (``runtime.cost_model.CostTable``). A lookup verify of w tokens beside B - 1 AR rows is such a step.
This script times it on the native backend (B rows over a cached past, every rep interleaved with the uniform
steps, the order reversed every other rep) and prints, per B and w: the step's time over the B-row AR step's
(median of per-rep ratios) and the price the same interpolation gives from the uniform cells timed in the same run.

    python scripts/bench_lookup_rows.py --batches 8,16 --widths 2,3,4,6,8,16 --out docs/bench/lookup-rows
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from recguide_trt.models.names import MODEL_HELP

UNIFORM_TOKENS = (1, 2, 3, 4)
"""Uniform widths timed per B: the cost table's grid up to 4 tokens a row (what a lookup row's mean width reaches)."""


def int_list(name: str, text: str, low: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"{name}: comma-separated integers, got {text!r}") from None
    if not values or min(values) < low:
        raise SystemExit(f"{name}: every value must be >= {low}, got {text!r}")
    return values


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help=MODEL_HELP)
    p.add_argument("--batches", default="8,16", help="rows per step (B)")
    p.add_argument("--widths", default="2,3,4,6,8,12,16", help="the one wider row's tokens (w)")
    p.add_argument("--past", type=int, default=320, help="cached tokens per row")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16",
                   help="compute_dtype and kv_cache_dtype of the native backend (default bfloat16)")
    p.add_argument("--out", type=Path, required=True, help="folder for table.md and results.json")
    a = p.parse_args(argv)
    a.batch_list = int_list("--batches", a.batches, 2)
    a.width_list = int_list("--widths", a.widths, 2)
    for name in ("past", "reps", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    import numpy as np
    import torch  # after the arguments: --help and bad values answer without it

    torch.set_num_threads(a.threads)
    from recguide_trt.backends.native_backend import NativeBackend
    from recguide_trt.bench.forward_cost import fill_past, ragged_verify_batch
    from recguide_trt.bench.peers.machine import cpu_model
    from recguide_trt.model.checkpoint import load_checkpoint
    from recguide_trt.models import resolve_model
    from recguide_trt.runtime.cost_model import CostTable

    load = os.getloadavg()
    model = load_checkpoint(resolve_model(a.model), dtype="float32", load_adapter=False).model
    B_max = max(a.batch_list)
    dtypes = {"compute_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"} if a.dtype == "bfloat16" else {}
    be = NativeBackend(model, B_max, a.past + max(max(a.width_list), max(UNIFORM_TOKENS)) + 16, **dtypes)
    fill_past(be, B_max, a.past)
    steps = {}
    for B in a.batch_list:
        for t in UNIFORM_TOKENS:
            steps[(B, "uniform", t)] = ragged_verify_batch([t] * B, a.past)
        for w in a.width_list:
            steps[(B, "lookup", w)] = ragged_verify_batch([w] + [1] * (B - 1), a.past)
    keys, times = list(steps), {k: [] for k in steps}
    for rep in range(a.reps):
        for k in (keys if rep % 2 == 0 else keys[::-1]):
            time.sleep(0.003)
            t0 = time.perf_counter()
            be.forward(steps[k])
            times[k].append((time.perf_counter() - t0) * 1e3)
    rows, lines = [], []
    uniform = {B: {t: min(times[(B, "uniform", t)]) for t in UNIFORM_TOKENS} for B in a.batch_list}
    for B in a.batch_list:
        ar = times[(B, "uniform", 1)]
        table = CostTable([B], list(UNIFORM_TOKENS), [[uniform[B][t] * 1e-3 for t in UNIFORM_TOKENS]])
        for w in a.width_list:
            ts = times[(B, "lookup", w)]
            measured = float(np.median([x / y for x, y in zip(ts, ar)]))
            tokens = B - 1 + w
            priced = table.step_time(B, tokens / B) / table.step_time(B, 1)
            rows.append({"batch": B, "width": w, "tokens": tokens, "ms": min(ts), "ar_ms": min(ar),
                         "measured_x_ar": measured, "priced_x_ar": priced})
            lines.append(f"| {B} | {w} | {tokens} | {min(ts):.2f} | {min(ar):.2f} | {measured:.3f} | {priced:.3f} |")
    text = "\n".join([
        f"# One wider row beside AR rows: {a.model}, {a.dtype} compute + KV", "",
        f"`python scripts/bench_lookup_rows.py {' '.join(argv if argv is not None else sys.argv[1:])}`", "",
        f"{cpu_model()}, {a.threads} threads, load average before the run {load[0]:.2f}; past {a.past}; best of "
        f"{a.reps} reps, every step interleaved; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
        "x AR: the step over the B-row AR step, the median of per-rep ratios. Priced: what RecGuide's cost table "
        "gives the same step (its mean width, interpolated in log(tokens) between the uniform B x 1 ... B x 4 cells "
        "timed in this run) over its B x 1 cell.", "",
        "| B | lookup row tokens | step tokens | ms | B AR ms | x AR measured | x AR priced |",
        "|---:|---:|---:|---:|---:|---:|---:|", *lines, ""])
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "table.md").write_text(text)
    (a.out / "results.json").write_text(json.dumps({"rows": rows, "uniform_ms": uniform, "cpu": cpu_model(), "load": load,
                                                    "args": {k: str(v) for k, v in vars(a).items()}}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
