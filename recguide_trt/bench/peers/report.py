"""The Markdown table of a run, from the results dict of :func:`.run.run_bench`.

Ratios are to the fastest peer in the same setting of the same run (never across runs); a row's
tok/s is its best round. Equality columns count outputs token-identical to the reference.
"""

from __future__ import annotations

from .rows import OUR_SUFFIXES

MODES = ("serial", "batch")


def best(results: dict, label: str, mode: str) -> float | None:
    """A row's best-round tok/s in ``mode`` (None when it has no successful round)."""
    vals = results["rows"][label][mode]["tok_s"]
    return max(vals) if vals else None


def fastest(results: dict, mode: str, ours: bool, prefix: str = "", suffix: str = "",
            exclude_suffix: str | tuple[str, ...] | None = None) -> tuple[str, float] | None:
    """(label, tok/s) of the fastest row of ours (or of the peers) in ``mode`` whose label starts with
    ``prefix``, ends with ``suffix`` and not with ``exclude_suffix`` (or any of them); None if there is none."""
    cands = [(best(results, lb, mode), lb) for lb, r in results["rows"].items()
             if r["ours"] == ours and lb.startswith(prefix) and lb.endswith(suffix)
             and not (exclude_suffix and lb.endswith(exclude_suffix))]
    cands = [(v, lb) for v, lb in cands if v is not None]
    if not cands:
        return None
    v, lb = max(cands)
    return lb, v


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def _ratio(v: float | None, ref: tuple[str, float] | None) -> str:
    return "-" if v is None or ref is None else f"{v / ref[1]:.2f}x"


def _equal(cell: dict) -> str:
    return f"{cell['equal']}/{cell['of']}" if "equal" in cell else "-"


def _summary(results: dict, mode: str, name: str) -> str:
    peer = fastest(results, mode, ours=False)
    lines = []
    present = [sfx for sfx in OUR_SUFFIXES if any(lb.endswith(sfx) for lb in results["rows"])]
    picks = [("our best", "", "", None), ("our best on `LLM()`'s default backend", "ours default", "", None)]
    if present:  # our all-float32 rows, and each suffix's rows, against the fastest peer
        picks += [("our best in float32", "", "", tuple(OUR_SUFFIXES))]
        picks += [(f"our best with {OUR_SUFFIXES[sfx].what}", "", sfx, None) for sfx in present]
    whats: dict[tuple[str, float], list[str]] = {}  # one line per row of ours: picks naming the same row share it
    for what, prefix, suffix, exclude in picks:
        ours = fastest(results, mode, ours=True, prefix=prefix, suffix=suffix, exclude_suffix=exclude)
        if ours is not None and peer is not None:
            whats.setdefault(ours, []).append(what)
    for ours, what in whats.items():
        lines.append(f"- {name}: {' = '.join(what)} ({ours[0]}, {ours[1]:.0f} tok/s) / fastest peer "
                     f"({peer[0]}, {peer[1]:.0f} tok/s) = **{ours[1] / peer[1]:.2f}x**")
    if peer is None:
        lines.append(f"- {name}: no peer ran, no ratio")
    return "\n".join(lines)


def divergence_lines(results: dict, limit: int = 40) -> list[str]:
    """One line per greedy mismatch: where, which tokens, and our logit margin when measured."""
    out = []
    for label, r in results["rows"].items():
        for mode in MODES:
            for d in r[mode].get("divergences", []):
                m = d.get("margin")
                margin = (f"; our fp32 logit margin ref - got = {m['fp32']:.2e} (fp64 {m['fp64']:.2e})"
                          if m else "")
                out.append(f"- {label}, {'batch-1' if mode == 'serial' else 'batched'}: prompt {d['prompt']} "
                           f"token {d['pos']}: ref {d['ref']}, got {d['got']}{margin}")
    if len(out) > limit:
        out = out[:limit] + [f"- ... {len(out) - limit} more in results.json"]
    return out


def format_table(results: dict) -> str:
    """The table, the ratios of our best to the fastest peer, mismatches and skipped rows."""
    s = results["settings"]
    b1, bn = "batch-1", f"batch-{s['batch_prompts']}"
    peer = {m: fastest(results, m, ours=False) for m in MODES}
    lines = [f"| engine | {b1} tok/s | x fastest peer | {bn} tok/s | x fastest peer | "
             f"== our AR ({b1}) | == our AR ({bn}) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for label, r in results["rows"].items():
        name = label
        if label.startswith("ours default") and r.get("info", {}).get("backend_class"):
            name += f" ({r['info']['backend_class']})"
        cells = [name]
        for m in MODES:
            v = best(results, label, m)
            cells += [_num(v), _ratio(v, peer[m])]
        cells += [_equal(r["serial"]), _equal(r["batch"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"{b1}: {s['serial_prompts']} prompts one at a time; {bn}: {s['batch_prompts']} prompts "
              f"submitted at once; {s['max_tokens']} new tokens each, greedy, EOS ignored; best of "
              f"{s['rounds']} interleaved round(s). Equality: outputs token-identical to "
              f"{results.get('reference') or 'no reference (our AR did not run)'} one prompt at a time.", ""]
    lines += [_summary(results, "serial", b1), _summary(results, "batch", bn)]
    own = []
    for lb, r in results["rows"].items():
        checks = [(m, r[m]["own_ar"]) for m in MODES if "own_ar" in r[m]]
        if checks:
            counts = ", ".join(f"{o['equal']}/{o['of']} ({b1 if m == 'serial' else bn})" for m, o in checks)
            own.append(f"- {lb}: {counts} equal to {checks[0][1]['label']}")
    if own:
        lines += ["", "Our rows against our AR of the same options (lossless check):", *own]
    div = divergence_lines(results)
    if div:
        lines += ["", "Greedy mismatches (first differing token):", *div]
    errors = [f"- {lb}, {m}: {e}" for lb, r in results["rows"].items() for m in MODES for e in r[m]["errors"][:1]]
    by_reason: dict[str, list[str]] = {}
    for lb, why in results.get("skipped", {}).items():  # rows of one worker fail for one reason
        by_reason.setdefault(why, []).append(lb)
    skipped = [f"- {', '.join(lbs)}: {why}" for why, lbs in by_reason.items()]
    if errors:
        lines += ["", "Failed calls:", *errors]
    if skipped:
        lines += ["", "Not run:", *skipped]
    return "\n".join(lines) + "\n"
