#!/usr/bin/env python
"""Native forward cost by shape on a real model, against this machine's bandwidth and FMA rate.

    python scripts/bench_forward.py [--model smollm2-135m] [--before OLD.cpp] [--out docs/bench/forward]

Per shape (rows x tokens over a cached past of --past tokens; 64x1 over --past-64): best-of---reps
ms, x the 1x1 step, GB/s of weights streamed and GFLOP/s (recguide_trt.bench.forward_cost). With
--before, a second build of the native kernel from that source (e.g. `git show REV:recguide_trt/
backends/native/nld_cpu.cpp > /tmp/before.cpp`) runs interleaved with the current one in the same
process, forward by forward (the order reversed every other rep), and the table gets its columns,
the speed-up of the bests and the paired one (the median over reps of before / now within a rep,
steadier on a shared CPU). With --bf16, the
current kernel also runs with compute_dtype="bfloat16" (bf16 x bf16 dot products into float32),
and with that plus kv_cache_dtype="bfloat16", interleaved the same way; with --kv-bf16, float32
compute over kv_cache_dtype="bfloat16" (a CPU without a bf16 dot). With --prefill, each shape
is a prompt prefill instead (PROMPTSxTOKENS over no past, the cache written, the head on each
prompt's last token: what the engine runs for a prompt). With --phases, a second table says where each
shape's time goes in the current kernel (its phase timers, fastest of --reps), one more per --before /
--bf16 / --kv-bf16 column (the backends in turn, rep by rep), and with --before each phase's paired
speed-up. Writes table.md and results.json under --out, with the CPU and the load average before the run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from recguide_trt.models.names import MODEL_HELP


def parse_shapes(text: str) -> list[tuple[int, int]]:
    try:
        shapes = [tuple(int(v) for v in part.lower().split("x")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"--shapes: expected ROWSxTOKENS,..., got {text!r}") from None
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise SystemExit(f"--shapes: expected ROWSxTOKENS,... with positive numbers, got {text!r}")
    return shapes


ROWS_NOTE = {
    "draft": (" Rows are draft blocks [seed, MASK x (T-1)] with the draft adapter on; 'x 1x1' divides by the "
              "1-token AR step timed beside them ({ar} ms); GB/s and GFLOP/s count the base weights only."),
    "fused": (" Rows are fused: a T-token verify row and its T-token prospective draft (2T tokens, the adapter on "
              "the draft's); 'x 1x1' divides by the 1-token AR step timed beside them ({ar} ms); GB/s and "
              "GFLOP/s count the base weights only."),
}


OTHER_COLUMNS = {
    "bf16": {"compute_dtype": "bfloat16"},
    "bf16+kv": {"compute_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"},
    "kv16": {"kv_cache_dtype": "bfloat16"},
}
"""The columns --bf16 (the first two) and --kv-bf16 add: the current kernel's options in each."""


def shape_label(key) -> str:
    """A shape (rows, tokens) as "RxT"; the AR step's key "ar" as is."""
    return key if isinstance(key, str) else f"{key[0]}x{key[1]}"


def phase_table(phases: dict, name: str = "now") -> str:
    """Markdown: one row per shape, a backend's phase timers (ms) and the forward's wall time."""
    names = [k for k in next(iter(phases.values())) if k != "total"]
    lines = [f"Where the time goes ('{name}' backend, its phase timers, ms; the fastest of --reps forwards, run "
             "after the table above, the backends in turn):", "",
             "| shape | " + " | ".join(names) + " | sum | forward |", "|" + "---|" * (len(names) + 3)]
    for key, ph in phases.items():
        lines.append(f"| {shape_label(key)} | " + " | ".join(f"{ph[n]:.2f}" for n in names)
                     + f" | {sum(ph[n] for n in names):.2f} | {ph['total']:.2f} |")
    return "\n".join(lines)


def paired_phase_table(ratios: dict) -> str:
    """Markdown: per shape, each phase's paired speed-up of 'now' over 'before' (before / now)."""
    names = list(dict.fromkeys(n for r in ratios.values() for n in r if n != "total"))
    lines = ["Each phase, 'now' against 'before' (the median over reps of before / now, the two forwards of a "
             "rep side by side; >1: now is faster):", "",
             "| shape | " + " | ".join(names) + " | forward |", "|" + "---|" * (len(names) + 2)]
    for key, r in ratios.items():
        lines.append(f"| {shape_label(key)} | " + " | ".join(f"{r[n]:.2f}x" if n in r else "-" for n in names)
                     + f" | {r['total']:.2f}x |")
    return "\n".join(lines)


def one_token_shares(streams: list[float], costs: dict, backends: dict) -> dict[str, float]:
    """Per backend: the median over reps of the 1x1 step's weight bytes per second over the read bandwidth
    probed right after that rep's forwards (the machine's streaming limit, minute by minute)."""
    import numpy as np

    out = {}
    for name in backends:
        c = costs.get((name, (1, 1)))
        if c is not None and streams:
            out[name] = float(np.median([c.weight_bytes / (ms * 1e-3) / 1e9 / s for ms, s in zip(c.rep_ms, streams)]))
    return out


def stream_line(streams: list[float], shares: dict[str, float]) -> str:
    """The read bandwidth probed between reps, and each backend's 1x1 step against it (:func:`one_token_shares`)."""
    import numpy as np

    if not streams:
        return ""
    line = (f"Read bandwidth probed after each rep's forwards: median {np.median(streams):.1f} GB/s "
            f"({min(streams):.1f}-{max(streams):.1f}).")
    if shares:
        line += (" The 1x1 step's bytes per second over its own rep's bandwidth (median over reps): "
                 + ", ".join(f"{name} {100 * v:.0f} %" for name, v in shares.items()) + ".")
    return line


def main(argv: list[str] | None = None) -> int:
    from recguide_trt.bench.forward_cost import (
        DEFAULT_SHAPES,
        ROW_KINDS,
        machine_limits,
        paired_phase_ratios,
        paired_ratio,
        phase_times,
        shape_batches,
        stream_probe,
        time_shapes,
    )
    from recguide_trt.bench.peers.machine import cpu_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help=MODEL_HELP)
    ap.add_argument("--shapes", default=",".join(f"{r}x{t}" for r, t in DEFAULT_SHAPES))
    ap.add_argument("--past", type=int, default=256, help="cached tokens per row (default 256)")
    ap.add_argument("--past-64", type=int, default=512, help="cached tokens per row of the 64x1 shape (default 512)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--before", type=Path, default=None, help="an older nld_cpu.cpp to compare against")
    ap.add_argument("--bf16", action="store_true",
                    help="also time compute_dtype='bfloat16', without and with kv_cache_dtype='bfloat16', interleaved")
    ap.add_argument("--kv-bf16", action="store_true",
                    help="also time float32 compute with kv_cache_dtype='bfloat16' (half the KV bytes), interleaved")
    ap.add_argument("--ab-dtype", choices=["float32", "bfloat16"], default="float32",
                    help="the arithmetic of the 'now' and '--before' columns: float32 (default), or bfloat16 "
                         "(compute_dtype and kv_cache_dtype bfloat16 in both, to compare kernels in bf16)")
    ap.add_argument("--prefill", action="store_true",
                    help="time each shape as a prompt prefill (PROMPTSxTOKENS, no past, the cache written, the "
                         "head on each prompt's last token) instead of rows over a cached past")
    ap.add_argument("--rows", choices=list(ROW_KINDS), default="verify",
                    help="what each shape's rows are: verify (causal, adapter off; default), draft (a block "
                         "[seed, MASK x (T-1)] with the draft adapter on) or fused (a T-token verify row and its "
                         "T-token prospective draft: 2T tokens per row); draft and fused load the model's draft "
                         "adapter, and the 1-token AR step is timed beside them as the 'x 1x1' base")
    ap.add_argument("--phases", action="store_true",
                    help="after the timed run, a second table: where each shape's time goes in the 'now' backend "
                         "(its phase timers: norms, projections, attention, MLP, head, head reduce), best of --reps; "
                         "one per other column, and with --before each phase's paired speed-up")
    ap.add_argument("--out", type=Path, default=Path("docs/bench/forward"))
    a = ap.parse_args(argv)
    if a.ab_dtype == "bfloat16" and (a.bf16 or a.kv_bf16):
        ap.error("--ab-dtype bfloat16 already times bf16 compute + KV in its columns; leave out --bf16 / --kv-bf16")
    if a.rows != "verify" and a.prefill:
        ap.error("--rows draft/fused time rows over a cached past; leave out --prefill")
    shapes = parse_shapes(a.shapes)
    if a.before is not None and not a.before.is_file():
        raise SystemExit(f"--before: {a.before} is not a file")
    import torch  # after the arguments: --help and bad values answer without loading it

    torch.set_num_threads(a.threads)
    from recguide_trt.backends.native.build import load_native
    from recguide_trt.backends.native_backend import NativeBackend
    from recguide_trt.model.checkpoint import load_checkpoint
    from recguide_trt.models import resolve_model

    load = os.getloadavg()
    model = load_checkpoint(resolve_model(a.model), dtype="float32", load_adapter=a.rows != "verify").model
    if a.rows != "verify" and not model.has_draft_adapter:
        raise SystemExit(f"--rows {a.rows}: {a.model} has no draft adapter (train one: recguide train-drafter)")
    rows = max(r for r, _ in shapes)
    cap = max(a.past, a.past_64) + 2 * max(t for _, t in shapes) + 16
    ab = {"compute_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"} if a.ab_dtype == "bfloat16" else {}
    backends = {"now": NativeBackend(model, rows, cap, **ab)}
    if a.before is not None:
        backends["before"] = NativeBackend(model, rows, cap, source=a.before, **ab)
    # The other arithmetics, each a column of its own timed against "now" (float32), in this order.
    others = [name for name, flag in (("bf16", a.bf16), ("bf16+kv", a.bf16), ("kv16", a.kv_bf16)) if flag]
    for name in others:
        backends[name] = NativeBackend(model, rows, cap, **OTHER_COLUMNS[name])
    limits = machine_limits(load_native(), a.threads)
    past_for = {(64, 1): a.past_64}
    probe, streams = stream_probe(load_native(), a.threads), []
    costs = time_shapes(backends, model, shapes, a.past, a.reps, past_for=past_for, prefill=a.prefill,
                        kind=a.rows, after_rep=lambda rep: streams.append(probe()))
    base_shape = (1, 1) if a.rows == "verify" else "ar"
    base = {name: costs[(name, base_shape)].ms for name in backends if (name, base_shape) in costs}

    head = ["shape", "past", "ms", "x 1x1", "GB/s", "GFLOP/s"]
    if "before" in backends:
        head += ["before ms", "before x 1x1", "speed-up", "paired"]
    for n in others:
        head += [f"{n} ms", f"{n} x 1x1", f"{n} speed-up"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    results = []
    for shape in shapes:
        c = costs[("now", shape)]
        row = [shape_label(shape), str(c.past), f"{c.ms:.2f}",
               f"{c.ms / base['now']:.2f}" if "now" in base else "-", f"{c.gbps:.1f}", f"{c.gflops:.0f}"]
        rec = {"shape": list(shape), "past": c.past, "ms": c.ms, "gbps": c.gbps, "gflops": c.gflops}
        if "before" in backends:
            b = costs[("before", shape)]
            paired = paired_ratio(b, c)
            row += [f"{b.ms:.2f}", f"{b.ms / base['before']:.2f}" if "before" in base else "-", f"{b.ms / c.ms:.2f}x",
                    f"{paired:.2f}x"]
            rec.update(before_ms=b.ms, paired_speedup=paired)
        for n in others:
            b = costs[(n, shape)]
            row += [f"{b.ms:.2f}", f"{b.ms / base[n]:.2f}" if n in base else "-", f"{c.ms / b.ms:.2f}x"]
            rec[f"{n}_ms"] = b.ms
        lines.append("| " + " | ".join(row) + " |")
        results.append(rec)
    machine = (f"{cpu_model()}, {os.cpu_count()} CPUs, {a.threads} threads, vector path "
               f"{load_native().vector_path()}, bf16 dot {load_native().bf16_dot()}; "
               f"load average before the run {load[0]:.2f}")
    limit_line = (f"Measured in the same run: read bandwidth {limits['stream_GBps']:.1f} GB/s, FMA rate "
                  f"{limits['fma_GFLOPs']:.0f} GFLOP/s (float32), bf16 dot rate {limits['bf16_dot_GFLOPs']:.0f} "
                  f"GFLOP/s ({load_native().bf16_dot()}). Weights streamed per forward: "
                  f"{costs[('now', shapes[0])].weight_bytes / 1e6:.0f} MB.")
    shares = one_token_shares(streams, costs, backends)
    limit_line += "\n\n" + stream_line(streams, shares)
    text = "\n".join([f"# Native forward cost: {a.model}", "", f"`python scripts/bench_forward.py "
                      f"{' '.join(argv if argv is not None else sys.argv[1:])}`", "", machine, "", limit_line, "",
                      f"'ms' and 'before' columns: {'bf16 compute + bf16 KV' if ab else 'float32'} arithmetic."
                      + (" Shapes are prompt prefills (no past, outputs from each prompt's last token)."
                         if a.prefill else "") + ROWS_NOTE.get(a.rows, "").format(ar=f"{base.get('now', 0):.2f}")
                      + (" 'kv16': float32 arithmetic over a bfloat16 KV cache." if a.kv_bf16 else ""), "",
                      *lines, ""])
    phases, paired_phases = {}, {}
    if a.phases:  # every backend of the table, in turn rep by rep; with --before, each phase's paired speed-up
        pasts = {shape: past_for.get(shape, a.past) for shape in shapes}
        batches = shape_batches(model, shapes, pasts, a.prefill, a.rows, ar_past=a.past)
        phases, every = phase_times(backends, batches, a.reps)
        for name in backends:
            text += "\n" + phase_table(phases[name], name) + "\n"
        if "before" in backends:
            paired_phases = {key: paired_phase_ratios(every["before"][key], every["now"][key]) for key in batches}
            text += "\n" + paired_phase_table(paired_phases) + "\n"
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "table.md").write_text(text)
    record = {"machine": machine, "limits": limits, "rows": results, "stream_GBps_each_rep": streams,
              "one_token_share_of_stream": shares}
    for name, ph in phases.items():  # "phases_ms" for the current kernel, "phases_ms_<column>" for the others
        record["phases_ms" if name == "now" else f"phases_ms_{name}"] = {shape_label(k): v for k, v in ph.items()}
    if paired_phases:  # per shape and phase: the median of per-rep before / now
        record["phases_paired_speedup"] = {shape_label(k): v for k, v in paired_phases.items()}
    (a.out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
