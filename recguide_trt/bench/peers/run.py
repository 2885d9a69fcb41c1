"""One benchmark run: start and warm up every row, take the greedy reference, then interleaved rounds.

Per round every live row runs once, in an order rotated by one each round (so no row always goes
first or last on a machine whose speed drifts): ``serial`` (batch-1: the serial prompts one at a
time) then ``batch`` (all batch prompts submitted at once). A row's tok/s in a setting is its best
round. Every row's first outputs in each setting are compared token for token with the reference
(our AR on the torch backend, one prompt at a time, run once before the rounds, untimed).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from .client import Pool, WorkerError
from .rows import Row

MODES = ("serial", "batch")


def compare(ref: list[list[int]], got: list[list[int]]) -> tuple[int, list[dict]]:
    """(identical outputs, first divergence of each other output: prompt, position, tokens)."""
    same, divs = 0, []
    for i, (a, b) in enumerate(zip(ref, got)):
        if a == b:
            same += 1
            continue
        k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
        divs.append({"prompt": i, "pos": k, "ref": a[k] if k < len(a) else None,
                     "got": b[k] if k < len(b) else None})
    return same, divs


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def run_bench(rows: list[Row], prompts: list[list[int]], pool: Pool, *, rounds: int, serial_prompts: int,
              batch_prompts: int, max_tokens: int, reference: str | None,
              log: Callable[[str], None] = print) -> dict:
    """Run every row; the results dict :mod:`.report` formats (tok/s per round, equality, skips)."""
    sp, bp = prompts[:serial_prompts], prompts[:batch_prompts]
    by_label = {r.label: r for r in rows}
    results: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    for row in rows:  # start + warm-up (our recguide measures its step-cost table on first use)
        t0 = time.perf_counter()
        try:
            w = pool.get(row)
            w.generate("serial", prompts[:2], min(16, max_tokens), row.knobs)
            w.generate("batch", prompts[:min(8, len(bp))], min(16, max_tokens), row.knobs)
        except WorkerError as exc:
            skipped[row.label] = _first_line(exc)
            log(f"{row.label:30s} skipped: {skipped[row.label]}")
            continue
        results[row.label] = {"ours": row.ours, "adapter": row.adapter, "opts": row.opts, "knobs": row.knobs,
                              "python": w.python, "info": w.info, "load_s": round(w.load_s, 2),
                              **{m: {"tok_s": [], "errors": []} for m in MODES}}
        log(f"{row.label:30s} ready (load + warm-up {time.perf_counter() - t0:.1f} s)")

    ref_outputs = None
    if reference in results:
        n = max(len(sp), len(bp))
        t0 = time.perf_counter()
        ref_outputs = pool.get(by_label[reference]).generate("serial", prompts[:n], max_tokens,
                                                             by_label[reference].knobs)["outputs"]
        log(f"reference ({reference}, {n} prompts one at a time) in {time.perf_counter() - t0:.1f} s")

    live = list(results)
    first: dict[tuple[str, str], list[list[int]]] = {}  # (label, mode) -> first outputs, for the own-AR check
    for r in range(rounds):
        order = live[r % len(live):] + live[:r % len(live)] if live else []
        for label in order:
            row, cell, line = by_label[label], results[label], f"round {r} {label:30s}"
            for mode, ps in (("serial", sp), ("batch", bp)):
                try:
                    reply = pool.get(row).generate(mode, ps, max_tokens, row.knobs)
                except WorkerError as exc:
                    cell[mode]["errors"].append(_first_line(exc))
                    line += f"  {mode} FAILED"
                    continue
                tok_s = reply["tokens"] / reply["elapsed_s"]
                cell[mode]["tok_s"].append(round(tok_s, 2))
                first.setdefault((label, mode), reply["outputs"])
                if ref_outputs is not None and "equal" not in cell[mode]:
                    same, divs = compare(ref_outputs[:len(ps)], reply["outputs"])
                    cell[mode].update(equal=same, of=len(ps), divergences=divs)
                line += f"  {mode}[{len(ps)}] {tok_s:8.1f} tok/s"
            log(line)
    _own_ar_equality(rows, results, first)
    return {"rows": results, "skipped": skipped, "reference": reference if ref_outputs is not None else None,
            "reference_outputs": ref_outputs,
            "settings": {"rounds": rounds, "serial_prompts": len(sp), "batch_prompts": len(bp),
                         "max_tokens": max_tokens}}


def _own_ar_equality(rows: list, results: dict, first: dict) -> None:
    """Each of our non-AR rows against our AR row of the same options (a bf16 row against bf16 AR): the
    lossless check where the reference (float32 AR) differs by arithmetic. Stored as ``own_ar``
    (``{"label", "equal", "of"}``) in each mode's cell."""
    ar = {json.dumps(r.opts, sort_keys=True): r.label for r in rows if r.ours and r.knobs.get("policy") == "ar"}
    for row in rows:
        twin = ar.get(json.dumps(row.opts, sort_keys=True))
        if not row.ours or row.label not in results or twin in (None, row.label):
            continue
        for mode in MODES:
            mine, theirs = first.get((row.label, mode)), first.get((twin, mode))
            if mine is not None and theirs is not None:
                same, _ = compare(theirs, mine)
                results[row.label][mode]["own_ar"] = {"label": twin, "equal": same, "of": len(mine)}
