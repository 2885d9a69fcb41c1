"""``recguide bench``: closed-loop concurrency sweep of every policy on one model (DESIGN.md §5).

For each concurrency C (ascending) every policy runs one cell before the sweep moves on to the
next C, so machine drift hits all policies alike. Policies: ``ar``, ``linearspec`` at each block
size (``--blocks`` plus the model's default block) and ``recguide``. One ``LLM`` instance (same
weights, backend and KV cache) serves every cell; the closed loop drives its engine in-process
(``bench.loop.run_cell``). Outputs in ``--out``: results.json, table.md, pareto.png, speedup.png
and, with ``--traces``, traces.json (per request per verify round: block, accepted, predicted
cut, hit) for ``scripts/simulate.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..models.names import MODEL_HELP
from ..runtime.cost_refit import RefittedCostTable
from ..runtime.metrics import aggregate
from ..runtime.params import PEER_CONTROLLERS, POLICIES, SamplingParams
from ..runtime.policies.recguide import BLOCK_GRID
from .loop import Cell, record_rounds, run_cell
from .report import same_work, write_report
from .step_interleave import StepClock, run_interleaved
from .workloads import WORKLOADS, load_prompts, prompt_texts

DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
FIXED_POLICIES = ("ar", "linearspec")
"""Policies whose cells make up "best fixed" (the oracle over fixed blocks)."""
CANDIDATE_BLOCKS = BLOCK_GRID
"""Default linearspec blocks: those of RecGuide's grid up to the engine's max block, i.e. every block RecGuide
may choose, so that "best fixed" is an oracle over the same choices."""


@dataclass(frozen=True)
class PolicySpec:
    label: str
    """Column name: ``ar``, ``linearspec-L{block}`` or ``recguide``."""
    policy: str
    """Runtime policy name."""
    block: int | None = None
    """linearspec block size (SamplingParams.block_size)."""


def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in str(text).replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


INTERLEAVE = ("cell", "request", "step")
"""How the sweep interleaves its policies (``--interleave``): whole cells in turn, at C = 1 single requests, or
(each policy on an engine of its own) single engine steps (:mod:`.step_interleave`)."""


def add_bench_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of ``recguide bench`` / ``scripts/bench_concurrency.py``."""
    g = parser.add_argument_group("model")
    g.add_argument("--model", default=None, help=MODEL_HELP)
    from ..backends.choice import BACKENDS, add_native_dtype_args

    g.add_argument("--backend", default=None, choices=BACKENDS,
                   help="default: as LLM() picks (native on the CPU in float32)")
    g.add_argument("--device", default="cpu")
    g.add_argument("--dtype", default=None)
    add_native_dtype_args(g)
    g.add_argument("--max-model-len", type=int, default=None, help="context window of the engine")
    g.add_argument("--max-block-size", type=int, default=None,
                   help="largest draft block of any policy (default: twice the model's block, at most 32); "
                        "the fixed linearspec blocks follow it")
    g.add_argument("--cost-past-len", type=int, default=None,
                   help="cached-prefix length RecGuide's start-up cost table is measured at (default: the "
                        "workload's typical context, the median prompt plus half of --max-tokens)")
    g = parser.add_argument_group("sweep")
    g.add_argument("--concurrency", type=_ints, default=list(DEFAULT_CONCURRENCY),
                   help="comma-separated closed-loop concurrencies (default 1,2,4,8,16,32,64)")
    g.add_argument("--policies", default="ar,linearspec,recguide",
                   help="comma-separated subset of " + ", ".join(POLICIES) + " (the last four: other "
                        "engines' speculation controllers; 'peers' stands for all four)")
    g.add_argument("--draft-len-schedule", type=Path, default=None, metavar="JSON",
                   help="the trtllm-schedule controller's tuned batch size -> draft length table (default: "
                        "docs/bench/draft_len_schedule.json, written by scripts/calibrate_draft_len_schedule.py)")
    g.add_argument("--blocks", type=_ints, default=None,
                   help="linearspec block sizes (default: every block RecGuide may use, 2 … the engine's max "
                        "block; the model's default block is always added)")
    g.add_argument("--requests", type=int, default=16,
                   help="measured requests per cell: max(2·C, this) (after one warm-up request per client)")
    g.add_argument("--repeats", type=int, default=1,
                   help="run every C's policy round R times and pool the cells (tokens / time summed); the "
                        "rounds' orders are balanced (each policy in each place and behind each other equally "
                        "often), so drift and bursts of load hit all policies alike")
    g.add_argument("--interleave", choices=INTERLEAVE, default="cell",
                   help="cell: each policy runs its cell of --requests in turn (default); request: at C = 1 the "
                        "policies take turns request by request, each round the same prompt, the order balanced "
                        "over rounds (each policy in each place and behind each other equally often), so "
                        "a shared host's drift falls on every policy alike, and each round is a paired repeat "
                        "(C > 1 still runs cells: policies there would share batches); step: at every C each "
                        "policy runs its cell on an engine of its own (same model and settings, its own KV "
                        "cache) and the engines take turns step by step, each timed by a clock that runs only "
                        "during its own steps, so drift falls on every policy alike at every C (memory: one KV "
                        "cache per policy, sized to the workload)")
    g.add_argument("--recguide", action="append", default=None, metavar="FIELD=VALUE",
                   help="set a field of the RecGuide policy's config (RecGuideConfig; repeatable), e.g. "
                        "--recguide switch_concurrency=0 (the adaptive mode at every load) or --recguide "
                        "lookup=false; the results record every override")
    g.add_argument("--no-warmup", action="store_true", help="measure from the first request of each client")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--ignore-eos", action="store_true", help="always generate max_tokens")
    g.add_argument("--workload", default="mixed", choices=WORKLOADS,
                   help="humaneval, held-out stdlib snippets, both alternating (mixed), or random ids")
    g.add_argument("--num-prompts", type=int, default=164, help="distinct prompts, cycled through")
    g.add_argument("--max-prompt-tokens", type=int, default=384, help="prompts are cut to their last N tokens")
    g.add_argument("--seed", type=int, default=0)
    g = parser.add_argument_group("output")
    g.add_argument("--out", type=Path, default=Path("results/bench"), help="output directory")
    g.add_argument("--traces", action="store_true", help="also write traces.json (acceptance per round)")
    g.add_argument("--no-plots", action="store_true", help="skip pareto.png / speedup.png")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = parser.add_argument_group("served")
    g.add_argument("--triton", default=None, metavar="HOST:PORT",
                   help="drive the sweep through a Triton server's gRPC endpoint instead of in-process")
    g.add_argument("--openai", default=None, metavar="URL",
                   help="drive the sweep through an OpenAI-compatible server (recguide serve), e.g. "
                        "http://127.0.0.1:8000")
    g.add_argument("--api-key", default=None, help="bearer key for --openai")
    return parser


def expand_policies(policies: list[str]) -> list[str]:
    """``--policies`` with ``peers`` standing for the four peer controllers."""
    return [q for p in policies for q in (PEER_CONTROLLERS if p == "peers" else (p,))]


def policy_specs(policies: list[str], blocks: list[int], default_block: int, max_block: int) -> list[PolicySpec]:
    specs = []
    for p in expand_policies(policies):
        if p == "ar":
            specs.append(PolicySpec("ar", "ar"))
        elif p == "linearspec":
            for b in sorted({*blocks, default_block}):
                if 2 <= b <= max_block:
                    specs.append(PolicySpec(f"linearspec-L{b}", "linearspec", b))
                else:
                    print(f"bench: skipping linearspec block {b} (engine max_block_size is {max_block})",
                          file=sys.stderr)
        elif p in POLICIES:
            specs.append(PolicySpec(p, p))
        else:
            raise ValueError(f"unknown policy {p!r}; choose from {', '.join(POLICIES)}")
    return specs


def environment(llm, args: argparse.Namespace | None = None) -> dict:
    import torch

    from .peers.machine import cpu_model

    cpu = cpu_model()
    commit = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    model_path = getattr(args, "model", None) if args is not None else None
    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv), "cpu": cpu, "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
        "platform": platform.platform(), "backend": getattr(llm.backend, "name", type(llm.backend).__name__),
        "device": getattr(args, "device", None) if args is not None else None,
        "model": str(model_path) if model_path else "embedded", "model_fingerprint": llm.config.fingerprint(),
        "model_block_size": llm.config.block_size, "engine_max_block": llm.engine.max_block,
        "max_num_seqs": llm.engine.config.max_num_seqs, "git_commit": commit,
    }


def _engine_snapshot(engine) -> dict:
    pol = engine.policies["recguide"]
    return {"steps": engine.steps, "time_forward": engine.time_forward, "time_step": engine.time_step,
            "conc": Counter(engine.concurrency_hist),
            "blocks": {c: Counter(v) for c, v in engine.blocks_by_concurrency.items()},
            "hits": pol.hits, "prospective": pol.prospective, "modes": dict(pol.mode_steps),
            "tie_rounds": pol.tie_rounds, "lookup_lost_hits": pol.lookup_lost_hits}


def engine_delta(before: dict, after: dict, engine) -> dict:
    """The engine's statistics restricted to one cell (its counters are cumulative)."""
    tf = after["time_forward"] - before["time_forward"]
    ts = after["time_step"] - before["time_step"]
    blocks = {}
    for c, cnt in after["blocks"].items():
        d = cnt - before["blocks"].get(c, Counter())
        if d:
            blocks[int(c)] = {int(k): v for k, v in sorted(d.items())}
    prospective = after["prospective"] - before["prospective"]
    rg = engine.policies["recguide"].stats()
    return {
        "steps": after["steps"] - before["steps"], "time_forward_s": tf, "time_step_s": ts,
        "overhead_share": 1 - tf / ts if ts > 0 else None,
        "concurrency_hist": {int(k): v for k, v in sorted((after["conc"] - before["conc"]).items())},
        "blocks_by_concurrency": blocks,
        "recguide_mode_steps": {k: after["modes"].get(k, 0) - before["modes"].get(k, 0) for k in after["modes"]},
        "recguide_hit_rate": ((after["hits"] - before["hits"]) / prospective) if prospective else None,
        "recguide_hits": after["hits"] - before["hits"], "recguide_prospective": prospective,
        # Hits above are net of these: fused rows' hits whose draft then gave way to a lookup, and plain verifies'
        # would-be hits (not in recguide_hits) that would have (RecGuidePolicy._settle_hits).
        "recguide_lookup_lost_hits": after["lookup_lost_hits"] - before["lookup_lost_hits"],
        "recguide_tie_rounds": after["tie_rounds"] - before["tie_rounds"],
        "recguide_switch_concurrency": rg.get("switch_concurrency"), "recguide_mode": rg.get("mode"),
    }


def pool_engine_deltas(deltas: list[dict]) -> dict:
    """:func:`engine_delta` of several runs of one cell, as if they were one."""
    tf = sum(d["time_forward_s"] for d in deltas)
    ts = sum(d["time_step_s"] for d in deltas)
    hist: Counter = Counter()
    blocks: dict[int, Counter] = {}
    modes: Counter = Counter()
    for d in deltas:
        hist.update(d["concurrency_hist"])
        modes.update(d["recguide_mode_steps"])
        for c, cnt in d["blocks_by_concurrency"].items():
            blocks.setdefault(c, Counter()).update(cnt)
    hits = sum(d["recguide_hits"] for d in deltas)
    prospective = sum(d["recguide_prospective"] for d in deltas)
    return {
        "steps": sum(d["steps"] for d in deltas), "time_forward_s": tf, "time_step_s": ts,
        "overhead_share": 1 - tf / ts if ts > 0 else None,
        "concurrency_hist": dict(sorted(hist.items())),
        "blocks_by_concurrency": {c: dict(sorted(v.items())) for c, v in sorted(blocks.items())},
        "recguide_mode_steps": dict(modes), "recguide_hit_rate": hits / prospective if prospective else None,
        "recguide_hits": hits, "recguide_prospective": prospective,
        "recguide_lookup_lost_hits": sum(d.get("recguide_lookup_lost_hits", 0) for d in deltas),
        "recguide_tie_rounds": sum(d["recguide_tie_rounds"] for d in deltas),
        "recguide_switch_concurrency": deltas[-1]["recguide_switch_concurrency"],
        "recguide_mode": deltas[-1]["recguide_mode"],
    }


CALIBRATION_TOKENS = 8
"""Tokens of :func:`calibrate`'s request."""


def calibrate(engine, prompt: list[int], measure_cost: bool) -> dict:
    """One short request on ``engine`` before the sweep: warms its backend and (when a policy of the sweep prices
    steps) measures the cost table."""
    t0 = time.perf_counter()
    params = SamplingParams(max_tokens=CALIBRATION_TOKENS, policy="recguide" if measure_cost else "ar")
    engine.submit(prompt, params)
    engine.run_until_done()
    pol = engine.policies["recguide"]
    info = {"seconds": time.perf_counter() - t0}
    if measure_cost and pol.cost is not None:
        info["cost_table"] = getattr(pol.cost, "table", pol.cost).to_dict()
    return info


def run_sweep(llm, prompts: list[list[int]], specs: list[PolicySpec], concurrencies: list[int],
              n_requests: int = 16, max_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
              ignore_eos: bool = False, warmup: bool = True, traces: bool = False, progress: bool = True,
              seed: int = 0, repeats: int = 1, per_client: int = 2,
              on_cell_start: Callable[[], None] | None = None, interleave: str = "cell") -> dict:
    """Run the interleaved sweep on ``llm`` and return results (cells, calibration, optional traces).

    With ``repeats`` R > 1 each C runs R rounds of all policies, in the orders of :func:`balanced_orders`
    (the first round in ``specs``' order), and each policy's R cells are pooled by :func:`pool_cells`.
    ``interleave="request"``: at C = 1 a round is one request per policy instead of a cell per policy
    (:func:`_request_rounds`), and the R × ``n_requests`` rounds are the repeats that are pooled.
    ``interleave="step"``: each policy runs on an engine of its own (``llm.new_engine``), and each repeat of a C
    steps all policies' cells in turns (:func:`~.step_interleave.run_interleaved`); the calibration's cost table is
    measured once and given to every engine; the statistics reported for the whole sweep are RecGuide's engine's.
    ``llm`` is anything with an ``engine`` (an ``LLM``, or the simulator's engine over its simulated
    backend); ``on_cell_start`` runs before every cell (the simulator resets its random streams).
    """
    if not prompts:
        raise ValueError("no prompts")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if interleave not in INTERLEAVE:
        raise ValueError(f"interleave must be one of {', '.join(INTERLEAVE)}, got {interleave!r}")
    engine = llm.engine
    costed = [s for s in specs if getattr(engine.policies[s.policy], "needs_cost", False)]
    if interleave == "step":
        engines, clocks = _step_engines(llm, specs, max(concurrencies), prompts, max_tokens)
        engine = engines[_recguide_label(specs) or specs[0].label]   # whose cost refit and statistics are reported
        first = (costed or specs)[0].label
        with clocks[first].running():   # the engine times its steps (and refits its costs) by this clock
            calib = calibrate(engines[first], prompts[0], bool(costed))
        measured = engines[first].policies["recguide"].cost
        if measured is not None:   # one start-up measurement for all, as one engine has in cell mode
            for e in engines.values():
                if e is not engines[first]:
                    e.use_cost_table(getattr(measured, "table", measured))
    else:
        if max(concurrencies) > engine.config.max_num_seqs:
            raise ValueError(f"concurrency {max(concurrencies)} exceeds the engine's max_num_seqs "
                             f"{engine.config.max_num_seqs}")
        calib = calibrate(engine, prompts[0], bool(costed))
    cells_out: list[dict] = []
    trace_out: list[dict] = []
    concurrencies = sorted(concurrencies)
    total = sum((0 if interleave == "request" and C == 1 else C if warmup else 0) + max(per_client * C, n_requests)
                for C in concurrencies) * len(specs) * repeats
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="req", dynamic_ncols=True)

    def on_finish(r, kind):
        if bar is not None and kind != "filler":
            bar.update(1)

    def make_params_for(spec: PolicySpec) -> Callable[[int], SamplingParams]:
        def make_params(tokens: int) -> SamplingParams:
            return SamplingParams(max_tokens=tokens, temperature=temperature, top_p=top_p,
                                  policy=spec.policy, block_size=spec.block, stop_at_eos=not ignore_eos)
        return make_params

    def keep_traces(spec: PolicySpec, C: int, res, sink: dict, base: int = 0) -> None:
        for r in res.requests:
            trace_out.append({"policy": spec.label, "C": C, "request": r.id,
                              "prompt": base + res.prompt_index[r.id],
                              "output_tokens": r.metrics.output_tokens, "rounds": sink.get(r.id, [])})

    for C in concurrencies:
        n_measured = max(per_client * C, n_requests)
        per_spec: dict[str, list] = {s.label: [] for s in specs}
        if interleave == "step":
            for _ in range(repeats):
                if bar is not None:
                    bar.set_description(f"C={C} all policies, step by step")
                if on_cell_start is not None:
                    on_cell_start()
                sinks: dict[str, dict] = {s.label: {} for s in specs}
                befores = {s.label: _engine_snapshot(engines[s.label]) for s in specs}
                with ExitStack() as stack:
                    for s in specs:
                        if traces:
                            stack.enter_context(record_rounds(engines[s.label].policies, sinks[s.label]))
                    cells = [Cell(engines[s.label], prompts, make_params_for(s), C, n_measured, max_tokens, s.label,
                                  warmup, on_finish) for s in specs]
                    results = run_interleaved(cells, [clocks[s.label] for s in specs])
                for s, res in zip(specs, results):
                    e = engines[s.label]
                    per_spec[s.label].append((res, engine_delta(befores[s.label], _engine_snapshot(e), e)))
                    if traces:
                        keep_traces(s, C, res, sinks[s.label])
            cells_out += [pool_cells(per_spec[s.label]) for s in specs]
            continue
        if interleave == "request" and C == 1:
            runs = _request_rounds(specs, prompts, n_measured, repeats, warmup)
        else:
            orders = balanced_orders(len(specs))
            runs = [_Run(specs[j], prompts, 0, n_measured, warmup, True) for r in range(repeats)
                    for j in orders[r % len(orders)]]
        for spec, cell_prompts, base, n, warm, keep in runs:
            if bar is not None:
                bar.set_description(f"C={C} {spec.label}")
            sink: dict[int, list] = {}
            if on_cell_start is not None:
                on_cell_start()
            before = _engine_snapshot(engine)
            with record_rounds(engine.policies if traces and keep else {}, sink):
                res = run_cell(engine, cell_prompts, make_params_for(spec), C, n, max_tokens, spec.label, warm,
                               on_finish if keep else None)
            if not keep:
                continue
            per_spec[spec.label].append((res, engine_delta(before, _engine_snapshot(engine), engine)))
            if traces:
                keep_traces(spec, C, res, sink, base)
        cells_out += [pool_cells(per_spec[s.label]) for s in specs]
    if bar is not None:
        bar.close()
    cost = engine.policies["recguide"].cost
    if calib.get("cost_table") is not None and isinstance(cost, RefittedCostTable):
        calib["cost_refit_final"] = cost.to_dict()   # the online corrections the sweep ended with
    return {"cells": cells_out, "calibration": calib, "traces": trace_out if traces else None,
            "engine_stats_total": _jsonable(engine.stats())}


def _recguide_label(specs: list[PolicySpec]) -> str | None:
    return next((s.label for s in specs if s.policy == "recguide"), None)


def _step_engines(llm, specs: list[PolicySpec], max_c: int, prompts: list[list[int]], max_tokens: int):
    """One engine per policy for ``interleave="step"`` (:meth:`~recguide_trt.api.LLM.new_engine`), each with its
    :class:`~.step_interleave.StepClock`, its KV cache sized to ``max_c`` sequences of the workload's longest
    prompt plus ``max_tokens``."""
    if not hasattr(llm, "new_engine"):
        raise ValueError("interleave='step' needs an LLM (one engine per policy); this target has one engine")
    need = max(max(len(p) for p in prompts) + max_tokens, len(prompts[0]) + CALIBRATION_TOKENS)
    clocks = {s.label: StepClock() for s in specs}
    engines = {s.label: llm.new_engine(clocks[s.label], max_num_seqs=max_c, max_model_len=need) for s in specs}
    return engines, clocks


class _Run(NamedTuple):
    """One :func:`~.loop.run_cell` call of the sweep."""

    spec: PolicySpec
    prompts: list[list[int]]
    """The prompts the call cycles through."""
    base: int
    """Index of ``prompts[0]`` in the workload's prompts (for the traces)."""
    n_measured: int
    warmup: bool
    keep: bool
    """False for an unmeasured warm-up run (no figures, no traces, no progress)."""


def _request_rounds(specs: list[PolicySpec], prompts: list[list[int]], n_requests: int, repeats: int,
                    warmup: bool) -> list[_Run]:
    """The C = 1 runs of ``interleave="request"``.

    A cell's requests become rounds: round k sends the k-th measured prompt of a C = 1 cell (the same
    prompts a cell would, its warm-up prompt first) once per policy, in the order of :func:`balanced_orders`'
    row k. A shared host's drift over minutes then falls on every policy alike, and each round's ratio
    between two policies compares the same prompt seconds apart. With ``warmup``, each policy first
    runs the warm-up prompt once, unmeasured (as a cell's first request is)."""
    first = 1 if warmup else 0
    runs = [_Run(spec, [prompts[0]], 0, 1, False, False) for spec in specs] if warmup else []
    orders = balanced_orders(len(specs))
    for k in range(n_requests * repeats):
        i = (first + k % n_requests) % len(prompts)
        runs += [_Run(specs[j], [prompts[i]], i, 1, False, True) for j in orders[k % len(orders)]]
    return runs


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of ``n`` items, one per round (a Williams design): each item takes each place equally often, and
    follows each other item equally often (once in n rows for even n, twice in 2n for odd n).

    Rotating one order by one each round keeps every item behind the same neighbour, so a policy that leaves the
    machine slower for the next request (a cache, a frequency) would always tax the same one."""
    if n < 1:
        raise ValueError(f"need at least one item, got {n}")
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(x + k) % n for x in first] for k in range(n)]
    rows = rows if n % 2 == 0 else rows + [row[::-1] for row in rows]
    # Renaming the items keeps the design balanced; this renaming makes the first row 0, 1, ..., n-1, so a
    # single round runs the policies in the order given.
    name = {x: i for i, x in enumerate(first)}
    return [[name[x] for x in row] for row in rows]


def pool_cells(runs: list) -> dict:
    """One cell from R >= 1 runs of the same (policy, C): tokens and time summed, requests pooled."""
    results = [res for res, _ in runs]
    tokens = sum(res.throughput["tokens"] for res in results)
    window = sum(res.throughput["window_s"] for res in results)
    measured = [r for res in results for r in res.requests]
    metrics = aggregate([r.metrics for r in measured],
                        wall_time=sum(res.metrics.get("wall_s", 0.0) for res in results))
    engine = pool_engine_deltas([e for _, e in runs])
    return {"policy": results[0].label, "C": results[0].concurrency, "metrics": metrics,
            "throughput": {"output_tok_s": tokens / window if window > 0 else None, "window_s": window,
                           "tokens": tokens, "repeats": [res.throughput["output_tok_s"] for res in results]},
            "inflight": {"min": min(res.inflight["min"] for res in results),
                         "max": max(res.inflight["max"] for res in results)},
            "failed": sum(res.failed for res in results), "engine": engine}


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item):
        return x.item()
    return x


def write_outputs(out: Path, results: dict, specs: list[PolicySpec], vanilla: str | None, env: dict,
                  config: dict, plots: bool = True) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    labels = [s.label for s in specs]
    fixed = [s.label for s in specs if s.policy in FIXED_POLICIES]
    recguide = "recguide" if "recguide" in labels else None
    notes = [f"Model {env.get('model')} (fingerprint {env.get('model_fingerprint')}, default block "
             f"{env.get('model_block_size')}), backend {env.get('backend')} on {env.get('cpu')}, "
             f"{env.get('torch_threads')} threads, torch {env.get('torch')}, {env.get('date')}.",
             "Aggregate tok/s: every token emitted while exactly C requests were in flight (steady window) / "
             "window; per-request figures over the measured requests (runtime.metrics.aggregate).",
             "best fixed = the best of AR and every fixed linearspec block at that C (an oracle); best peer = "
             "the best of the other engines' speculation controllers at that C."]
    if config.get("interleave") == "step":
        notes.append("Interleaved step by step (--interleave step): each policy on an engine of its own, the engines "
                     "stepped in turns, each cell timed by its own engine's steps only.")
    elif config.get("interleave") == "request":
        notes.append("At C = 1 the policies took turns request by request (--interleave request); cells above.")
    if config.get("recguide"):
        notes.append("RecGuide's config overridden: " + ", ".join(config["recguide"]) + " (--recguide).")
    peers = [s.label for s in specs if s.policy in PEER_CONTROLLERS]
    summary = write_report(out, results["cells"], labels, vanilla, fixed, recguide, "Closed-loop concurrency sweep",
                           notes, plots, peers)
    payload = {"environment": env, "config": config, "policies": labels, "vanilla": vanilla,
               "policy_blocks": {s.label: s.block for s in specs},
               "summary": summary, "cells": results["cells"], "calibration": results["calibration"],
               "engine_stats_total": results["engine_stats_total"]}
    (out / "results.json").write_text(json.dumps(_jsonable(payload), indent=1))
    if results.get("traces") is not None:
        (out / "traces.json").write_text(json.dumps({"environment": env, "requests": results["traces"]}))
    return summary


def typical_context(prompts: list[list[int]], max_tokens: int) -> int:
    """The cached prefix a decode step typically sees: the median prompt plus half the output."""
    lens = sorted(len(p) for p in prompts)
    return max(1, lens[len(lens) // 2] + max_tokens // 2) if lens else max(1, max_tokens // 2)


def run_bench(args: argparse.Namespace) -> int:
    """Entry point of ``recguide bench`` (arguments from :func:`add_bench_args`)."""
    from ..api import LLM
    from ..runtime.config_overrides import recguide_config
    from ..runtime.engine import EngineConfig

    if getattr(args, "triton", None) or getattr(args, "openai", None):
        if getattr(args, "interleave", "cell") != "cell":
            raise SystemExit(f"bench: --interleave {args.interleave} runs in-process only (leave out --triton / "
                             "--openai)")
        if getattr(args, "recguide", None):
            raise SystemExit("bench: --recguide configures the in-process engine; a served bench measures the "
                             "server's own (leave out --triton / --openai)")
        return run_served_bench(args)

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    max_c = max(args.concurrency)
    if args.max_block_size is not None and args.max_block_size < 2:
        raise SystemExit(f"bench: --max-block-size must be >= 2, got {args.max_block_size}")
    controllers = {}
    if "trtllm-schedule" in expand_policies(policies):
        from ..runtime.policies.trtllm_schedule import TrtllmScheduleConfig
        from .schedule_calibration import DEFAULT_SCHEDULE, read_schedule

        try:
            schedule = read_schedule(args.draft_len_schedule or DEFAULT_SCHEDULE)
        except ValueError as exc:
            raise SystemExit(f"bench: {exc}") from None
        controllers["trtllm_schedule"] = TrtllmScheduleConfig(draft_len_schedule=schedule)
    controllers["recguide"] = recguide_config(getattr(args, "recguide", None))
    step = getattr(args, "interleave", "cell") == "step"
    llm = LLM(model=args.model, backend=args.backend, device=args.device, dtype=args.dtype,
              compute_dtype=args.compute_dtype, kv_cache_dtype=args.kv_cache_dtype,
              max_model_len=args.max_model_len,
              # --interleave step runs every cell on engines of its own (sized max_c): this one's KV stays small
              engine_config=EngineConfig(max_num_seqs=1 if step else max_c, max_block_size=args.max_block_size,
                                         **controllers, prefix_cache=False))  # every cell replays the prompts
    cfg = llm.config
    blocks = args.blocks or [b for b in CANDIDATE_BLOCKS if b <= llm.engine.max_block]
    specs = policy_specs(policies, blocks, min(cfg.block_size, llm.engine.max_block), llm.engine.max_block)
    if not specs:
        raise SystemExit("bench: no policy to run")
    vanilla_block = min(cfg.block_size, llm.engine.max_block)
    vanilla = f"linearspec-L{vanilla_block}" if any(s.label == f"linearspec-L{vanilla_block}" for s in specs) \
        else None
    limit = llm.engine.config.max_model_len - args.max_tokens
    if limit < 1:
        raise SystemExit(f"bench: max_tokens {args.max_tokens} leaves no room for a prompt in max_model_len "
                         f"{llm.engine.config.max_model_len}")
    encode = llm.tokenizer.encode if llm.tokenizer is not None else None
    prompts = load_prompts(args.workload, args.num_prompts, encode, cfg.vocab_size,
                           min(args.max_prompt_tokens, limit), avoid=(cfg.mask_token_id, cfg.eos_token_id),
                           seed=args.seed, render_chat=llm.chat_prompt if llm.has_chat_template else None)
    past = args.cost_past_len if args.cost_past_len is not None else typical_context(prompts, args.max_tokens)
    if past < 1:
        raise SystemExit(f"bench: --cost-past-len must be >= 1, got {past}")
    llm.engine.config.cost_past_len = past  # read when RecGuide first needs its table
    results = run_sweep(llm, prompts, specs, args.concurrency, args.requests, args.max_tokens, args.temperature,
                        args.top_p, args.ignore_eos, not args.no_warmup, args.traces, not args.no_progress,
                        args.seed, args.repeats, interleave=args.interleave)
    env = environment(llm, args)
    env["max_num_seqs"] = max_c   # the engines' (with --interleave step, not this LLM's own)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if not callable(v)}
    config["num_prompts_loaded"] = len(prompts)
    config["recguide_config"] = dataclasses.asdict(llm.engine.config.recguide)   # with the --recguide overrides
    summary = write_outputs(args.out, results, specs, vanilla, env, config, not args.no_plots)
    print((args.out / "table.md").read_text().split("## Per-request")[0])
    for row in summary:
        parts = [f"{name} {row[key]:.3f}" for key, name in (
            ("recguide_over_vanilla", "RecGuide / vanilla"),
            ("recguide_over_best_fixed", f"/ best fixed ({row['best_fixed']})"),
            ("recguide_over_best_peer", f"/ best peer ({row.get('best_peer')})")) if row.get(key) is not None]
        reps = row.get("recguide_over_best_fixed_repeats")
        if reps:
            parts.append(f"paired per repeat {statistics.median(reps):.3f} ({len(reps)} repeats)")
        same = same_work(row)
        if same:
            parts.append(f"(AR-only, the same forwards as the {' and the '.join(same)})")
        if parts:
            print(f"C={row['C']}: " + ", ".join(parts))
    print(f"wrote {args.out}/results.json, table.md" + ("" if args.no_plots else ", pareto.png, speedup.png")
          + (", traces.json" if args.traces else ""))
    failed = {f"{c['policy']} C={c['C']}": c["failed"] for c in results["cells"] if c["failed"]}
    if failed:
        # Throughput of requests that died early is meaningless: make the run fail loudly.
        print(f"bench: requests FAILED in {len(failed)} cells ({failed}); the figures are not valid",
              file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = add_bench_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    return run_bench(parser.parse_args(argv))


def run_served_bench(args: argparse.Namespace) -> int:
    """``recguide bench --triton URL`` / ``--openai URL``: the closed-loop sweep through a server
    (client-side timings), written to ``triton_results.json`` / ``openai_results.json``."""
    import json

    from ..serving.triton_bench import format_rows

    if args.triton and args.openai:
        raise SystemExit("bench: pass --triton or --openai, not both")
    prompts = prompt_texts(args.workload, args.num_prompts)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if args.openai:
        from ..serving.openai_bench import run_openai_sweep

        def sweep(c: int, policy: str) -> list[dict]:
            return run_openai_sweep(args.openai, prompts, [c], max_tokens=args.max_tokens, policy=policy,
                                    temperature=args.temperature, top_p=args.top_p,
                                    requests_per_level=max(2 * c, args.requests), api_key=args.api_key)
    else:
        from ..serving.triton_bench import run_triton_sweep

        def sweep(c: int, policy: str) -> list[dict]:
            return run_triton_sweep(args.triton, prompts, [c], max_tokens=args.max_tokens, policy=policy,
                                    temperature=args.temperature, top_p=args.top_p,
                                    requests_per_level=max(2 * c, args.requests))
    rows = [row for c in args.concurrency for policy in policies for row in sweep(c, policy)]
    args.out.mkdir(parents=True, exist_ok=True)
    name = "openai_results.json" if args.openai else "triton_results.json"
    (args.out / name).write_text(json.dumps(rows, indent=1, default=str))
    print(format_rows(rows))
    print(f"wrote {args.out / name}")
    return 1 if any(r["errors"] for r in rows) else 0
