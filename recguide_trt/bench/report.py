"""Tables and figures of a concurrency sweep (real or projected): table.md, pareto.png, speedup.png."""

from __future__ import annotations

import statistics
from pathlib import Path


def _fmt(x, nd: int = 1) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def cell_index(cells: list[dict]) -> dict[tuple[str, int], dict]:
    return {(c["policy"], int(c["C"])): c for c in cells}


def tok_s(cell: dict | None) -> float | None:
    """The cell's aggregate throughput: the steady-window closed-loop figure (see bench.loop)."""
    if cell is None:
        return None
    return cell["throughput"].get("output_tok_s")


AR_ONLY = 0.99
"""Share of a cell's decode forwards that must be plain AR steps for :func:`ar_only` (one stray round
of a warm policy in thousands of AR steps does not make its work different)."""


def ar_only(cell: dict | None) -> bool:
    """Whether a cell decoded with AR steps alone (at least :data:`AR_ONLY` of its decode forwards).

    Two such cells of one sweep ran the same forwards (greedy output is identical whichever policy
    runs), so their throughput ratio measures the host's drift between the cells, not the policies:
    on the 2-core CPUs a cell of identical work varies by 5-10 % from one minute to the next.
    """
    if cell is None:
        return False
    f = cell.get("metrics", {}).get("forwards") or {}
    decode = sum(v for k, v in f.items() if k != "prefill")
    return decode > 0 and f.get("ar", 0) >= AR_ONLY * decode


SAME_WORK = (("best fixed", "recguide_same_work_as_best_fixed"), ("best peer", "recguide_same_work_as_best_peer"))
"""The summary row's flags of :func:`ar_only` work shared with RecGuide, and how a report names each."""


def same_work(row: dict) -> list[str]:
    """Which of the best fixed policy and the best peer ran the same AR-only forwards as RecGuide in
    this summary row (their ratios to RecGuide then measure drift, not policy)."""
    return [name for name, key in SAME_WORK if row.get(key)]


def summarize(cells: list[dict], labels: list[str], vanilla: str | None, fixed: list[str],
              recguide: str | None, peers: list[str] = ()) -> list[dict]:
    """Per C: throughput per policy, the best fixed policy (oracle), the best peer controller
    (``peers``: other engines' speculation controllers) and RecGuide's ratios to them."""
    idx = cell_index(cells)
    rows = []
    for C in sorted({int(c["C"]) for c in cells}):
        row: dict = {"C": C, "tok_s": {}, "per_request_tok_s": {}}
        for lab in labels:
            cell = idx.get((lab, C))
            row["tok_s"][lab] = tok_s(cell)
            row["per_request_tok_s"][lab] = cell["metrics"].get("per_request_tok_s") if cell else None
        fixed_vals = [(row["tok_s"][f], f) for f in fixed if row["tok_s"].get(f)]
        best = max(fixed_vals) if fixed_vals else (None, None)
        row["best_fixed"], row["best_fixed_tok_s"] = best[1], best[0]
        rg = row["tok_s"].get(recguide) if recguide else None
        van = row["tok_s"].get(vanilla) if vanilla else None
        row["recguide_over_vanilla"] = rg / van if rg and van else None
        row["recguide_over_best_fixed"] = rg / best[0] if rg and best[0] else None
        row["recguide_over_best_fixed_repeats"] = _repeat_ratios(idx.get((recguide, C)), idx.get((best[1], C)))
        rg_ar = ar_only(idx.get((recguide, C)))
        row["recguide_same_work_as_best_fixed"] = rg_ar and ar_only(idx.get((best[1], C)))
        peer_vals = [(row["tok_s"][p], p) for p in peers if row["tok_s"].get(p)]
        best_peer = max(peer_vals) if peer_vals else (None, None)
        row["best_peer"], row["best_peer_tok_s"] = best_peer[1], best_peer[0]
        row["recguide_over_peer"] = {p: (rg / v if rg else None) for v, p in peer_vals}
        row["recguide_over_best_peer"] = rg / best_peer[0] if rg and best_peer[0] else None
        row["recguide_over_best_peer_repeats"] = _repeat_ratios(idx.get((recguide, C)), idx.get((best_peer[1], C)))
        row["recguide_same_work_as_best_peer"] = rg_ar and ar_only(idx.get((best_peer[1], C)))
        rows.append(row)
    return rows


def _repeat_ratios(num: dict | None, den: dict | None) -> list[float] | None:
    """Ratio of two cells' throughput in each repeat (repeats run in the same rotation round, so
    each ratio compares policies measured minutes apart, not a whole sweep apart); None unless both
    cells have two or more repeats."""
    a = (num or {}).get("throughput", {}).get("repeats") or []
    b = (den or {}).get("throughput", {}).get("repeats") or []
    if len(a) < 2 or len(a) != len(b) or not all(b):
        return None
    return [x / y for x, y in zip(a, b)]


SPREAD_HEAD = "per repeat: median (min–max)"
"""The column of per-repeat ratios. The median is the paired figure: each repeat's ratio compares two policies
run in the same rotation round (with ``--interleave request``, the same prompt seconds apart), so drift on a
shared host cancels in it, where the pooled ratio carries whatever drift fell unevenly on the two."""


def _spread(reps: list[float] | None) -> str:
    return f"{statistics.median(reps):.3f} ({min(reps):.3f}–{max(reps):.3f})" if reps else "–"


def markdown_table(summary: list[dict], cells: list[dict], labels: list[str], vanilla: str | None,
                   recguide: str | None, title: str, notes: list[str] = ()) -> str:
    idx = cell_index(cells)
    out = [f"# {title}", ""]
    out += [f"{n}" for n in notes]
    if notes:
        out.append("")
    van_col = f"RecGuide / vanilla ({vanilla})" if vanilla else "RecGuide / vanilla"
    spread = any(row.get("recguide_over_best_fixed_repeats") for row in summary)
    out += ["## Aggregate output tok/s (closed loop, C in flight)", "",
            "| C | " + " | ".join(labels) + f" | {van_col} | RecGuide / best fixed | best fixed |"
            + (f" {SPREAD_HEAD} |" if spread else ""),
            "|---:|" + "---:|" * len(labels) + "---:|---:|:---|" + ("---:|" if spread else "")]
    for row in summary:
        vals = [_fmt(row["tok_s"][lab]) for lab in labels]
        extra = f" {_spread(row.get('recguide_over_best_fixed_repeats'))} |" if spread else ""
        out.append(f"| {row['C']} | " + " | ".join(vals) + f" | {_fmt(row['recguide_over_vanilla'], 3)} | "
                   f"{_fmt(row['recguide_over_best_fixed'], 3)} | {row['best_fixed'] or '–'} |" + extra)
    peers = [p for p in labels if any(p in (row.get("recguide_over_peer") or {}) for row in summary)]
    if recguide and peers:
        spread = any(row.get("recguide_over_best_peer_repeats") for row in summary)
        out += ["", "## RecGuide / peer speculation controllers (aggregate tok/s ratios)", "",
                "| C | " + " | ".join(f"RecGuide / {p}" for p in peers) + " | RecGuide / best peer | best peer |"
                + (f" {SPREAD_HEAD} |" if spread else ""),
                "|---:|" + "---:|" * len(peers) + "---:|:---|" + ("---:|" if spread else "")]
        for row in summary:
            ratios = row.get("recguide_over_peer") or {}
            extra = f" {_spread(row.get('recguide_over_best_peer_repeats'))} |" if spread else ""
            out.append(f"| {row['C']} | " + " | ".join(_fmt(ratios.get(p), 3) for p in peers)
                       + f" | {_fmt(row.get('recguide_over_best_peer'), 3)} | {row.get('best_peer') or '–'} |" + extra)
    same = [(row["C"], same_work(row)) for row in summary if same_work(row)]
    if same:
        out += ["", "Same work: " + "; ".join(f"C = {C}, RecGuide and the {' and the '.join(who)}" for C, who in same)
                + f" ran AR steps only (≥ {AR_ONLY:.0%} of decode forwards). Those ratios compare identical"
                " forwards: they measure the host's drift between cells (with --interleave step, what is left of it"
                " and the policies' host work), not the policies' choices."]
    out += ["", "## Per-request tok/s (output tokens / (finish − first token), mean)", "",
            "| C | " + " | ".join(labels) + " |", "|---:|" + "---:|" * len(labels)]
    for row in summary:
        out.append(f"| {row['C']} | " + " | ".join(_fmt(row["per_request_tok_s"][lab]) for lab in labels) + " |")
    out += ["", "## Per cell", "",
            "| policy | C | req | MAL | TPF | forwards (draft/verify/fused/ar) | hit rate | blocks | TTFT ms "
            "| TPOT ms | overhead | recguide modes |",
            "|:---|---:|---:|---:|---:|:---|---:|:---|---:|---:|---:|:---|"]
    for row in summary:
        for lab in labels:
            cell = idx.get((lab, row["C"]))
            if cell is None:
                continue
            m = cell["metrics"]
            f = m.get("forwards", {})
            fw = "/".join(str(f.get(k, 0)) for k in ("draft", "verify", "fused", "ar"))
            blocks = " ".join(f"{k}:{v}" for k, v in sorted((m.get("block_sizes") or {}).items(),
                                                            key=lambda kv: int(kv[0])))
            eng = cell.get("engine", {})
            modes = ""
            if lab == recguide:
                modes = " ".join(f"{k}:{v}" for k, v in (eng.get("recguide_mode_steps") or {}).items() if v)
                if eng.get("recguide_tie_rounds"):
                    modes += f" tie-probes:{eng['recguide_tie_rounds']}"
                if eng.get("recguide_lookup_lost_hits"):
                    modes += f" hits-lost-to-lookups:{eng['recguide_lookup_lost_hits']}"
            out.append(f"| {lab} | {row['C']} | {m.get('requests', 0)} | {_fmt(m.get('mal'), 2)} | "
                       f"{_fmt(m.get('tpf'), 2)} | {fw} | {_fmt(m.get('hit_rate'), 2)} | {blocks} | "
                       f"{_fmt(ms(m.get('ttft_mean')))} | {_fmt(ms(m.get('tpot_mean')), 2)} | "
                       f"{_fmt(eng.get('overhead_share'), 2)} | {modes} |")
    out.append("")
    return "\n".join(out)


def ms(x: float | None) -> float | None:
    return None if x is None else 1e3 * x


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_pareto(path: Path, cells: list[dict], labels: list[str], title: str, peers: list[str] = ()) -> None:
    """Aggregate tok/s (y) against per-request tok/s (x); one curve per policy, points labelled by C
    (peer controllers dashed)."""
    plt = _plt()
    idx = cell_index(cells)
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    for lab in labels:
        pts = sorted((C, idx[(p, C)]) for (p, C) in idx if p == lab)
        xs = [c["metrics"].get("per_request_tok_s") for _, c in pts]
        ys = [tok_s(c) for _, c in pts]
        keep = [(x, y, C) for x, y, (C, _) in zip(xs, ys, pts) if x is not None and y is not None]
        if not keep:
            continue
        if lab.startswith("recguide"):
            style = dict(lw=2.5, marker="o")
        elif lab in peers:
            style = dict(lw=1.4, marker="s", ls="--", markersize=3)
        else:
            style = dict(lw=1.2, marker=".")
        ax.plot([k[0] for k in keep], [k[1] for k in keep], label=lab, **style)
        for x, y, C in keep:
            ax.annotate(f"C={C}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
    ax.set_xlabel("per-request tok/s")
    ax.set_ylabel("aggregate output tok/s")
    _finish(plt, fig, ax, path, title)


def _finish(plt, fig, ax, path: Path, title: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_speedup(path: Path, summary: list[dict], vanilla: str | None, title: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    Cs = [r["C"] for r in summary]
    for key, lab in (("recguide_over_vanilla", f"RecGuide / vanilla ({vanilla})"),
                     ("recguide_over_best_fixed", "RecGuide / best fixed (oracle)"),
                     ("recguide_over_best_peer", "RecGuide / best peer controller")):
        pts = [(C, r.get(key)) for C, r in zip(Cs, summary) if r.get(key) is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=lab)
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency C (closed loop)")
    ax.set_ylabel("aggregate tok/s ratio")
    _finish(plt, fig, ax, path, title)


def write_report(out: Path, cells: list[dict], labels: list[str], vanilla: str | None, fixed: list[str],
                 recguide: str | None, title: str, notes: list[str] = (), plots: bool = True,
                 peers: list[str] = ()) -> list[dict]:
    """Write table.md (+ pareto.png and speedup.png) into ``out``; returns the per-C summary."""
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(cells, labels, vanilla, fixed, recguide, peers)
    (out / "table.md").write_text(markdown_table(summary, cells, labels, vanilla, recguide, title, notes))
    if plots:
        plot_pareto(out / "pareto.png", cells, labels, f"{title}: aggregate vs per-request tok/s", peers)
        plot_speedup(out / "speedup.png", summary, vanilla, f"{title}: RecGuide speedup vs C")
    return summary
