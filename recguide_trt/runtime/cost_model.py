"""Step-cost table T(batch, tokens) measured on the running backend (DESIGN.md §3.2).

RecGuide never assumes timings: at start-up it times packed forwards over a small grid of batch
sizes and tokens per row, caches the table per model/backend/device/threads, and interpolates.
Each multi-token cell is probed twice: with the draft gate on half its tokens, as a step with a
draft in it runs (draft rows next to verify rows, or a fused row's prospective half), and with no
gate, as a step of verifies only runs (the adapter's matmuls are skipped). The adapter costs real
time on a small model: 8 tokens at C=1 cost 3.93 ms plain and 5.26 ms with draft tokens on the
2-core CPU (docs/bench/results.json, ``calibration``); one price for both over-priced plain
speculation against AR and against overlap.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..backends.base import ForwardBatch

log = logging.getLogger(__name__)

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_TOKENS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""New tokens per row the start-up table measures: RecGuide's block grid (``policies.recguide.BLOCK_GRID``) and
twice each (a fused row). Between measured cells the price is interpolated in log(tokens), and a batch-1 forward's
cost is flat up to a few tokens then nearly linear: measured only at powers of two, 6 tokens were priced above
their cost. On the Zen 4 EPYC (bf16 + KV) a 6-token forward took 9.85 ms, what 4 took (9.84; 8: 11.92), where the
interpolation gave 11.06 (``scripts/bench_forward.py --shapes 1x1,1x4,1x6,1x8 --ab-dtype bfloat16``): AVX-512's row
tiles take 6 rows in one pass."""
FINE_TOKENS_MAX_BATCH = 8
"""Above this many rows only the power-of-two token counts of the grid are probed; the others are interpolated in
log(tokens) between them. There a step is compute-bound and nearly linear in its tokens, and the grid's 3, 6,
12, 24 and 48 tokens probed at 16-64 rows made a 64-slot engine's start-up table take 41.6 s; probed so, its first
RecGuide request took 26.4 s, the table included (ad hoc, the Zen 4 EPYC, bf16 + KV). The flat-then-linear cost
that mispriced 6 tokens is a few-row effect."""
LONG_PROBE_S = 0.15
"""A probe whose first forward takes this long is timed by that forward alone (see :func:`measure_cost_table`)."""
PROBE_VERSION = 9
"""Bumped whenever the probe changes, so cached tables measured the old way are not reused."""


@dataclass
class CostTable:
    """Seconds per forward of ``batch`` rows × ``tokens`` new tokens each (past length fixed)."""

    batches: list[int]
    """Grid of batch sizes (ascending)."""
    tokens: list[int]
    """Grid of new tokens per row (ascending)."""
    seconds: list[list[float]]
    """``seconds[i][j]``: forward time at ``batches[i]`` × ``tokens[j]``."""
    meta: dict = field(default_factory=dict)
    """Where it was measured: backend, device, threads, model fingerprint, past length."""
    plain: list[list[float]] | None = None
    """The same cells with no draft token in the step (AR, verify-only steps: no adapter work).
    None: priced like ``seconds`` (tables from elsewhere, e.g. the projection's)."""

    def __post_init__(self) -> None:
        # Plain Python floats: the chooser asks for many step times per step, numpy scalars are slow.
        self._grids = {True: [[float(v) for v in row] for row in self.seconds]}
        self._grids[False] = ([[float(v) for v in row] for row in self.plain] if self.plain is not None
                              else self._grids[True])
        self._lb = [math.log(b) for b in self.batches]
        self._lt = [math.log(t) for t in self.tokens]
        self._memo: dict[tuple[float, float, bool], float] = {}

    def step_time(self, batch: float, tokens: float, adapter: bool = True) -> float:
        """Bilinear interpolation in log(batch), log(tokens); linear extrapolation past the grid.

        ``adapter``: whether the step carries a draft token (a draft or fused row); False prices
        a step of AR / verify rows only.
        """
        key = (batch, tokens, adapter)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._interpolate(self._grids[adapter], batch, tokens)
        return hit

    @staticmethod
    def _weights(axis: list[float], v: float) -> tuple[int, float, float]:
        """(index i, weight of i+1, scale): value = (v[i]·(1-w) + v[i+1]·w)·scale along the axis."""
        if len(axis) == 1:
            return 0, 0.0, 1.0
        if v > axis[-1]:
            # Past the grid cost grows about linearly with work: extrapolate in linear space.
            return len(axis) - 2, 1.0, math.exp(v - axis[-1])
        i = min(max(bisect.bisect_left(axis, v) - 1, 0), len(axis) - 2)
        return i, (v - axis[i]) / (axis[i + 1] - axis[i]), 1.0

    def _interpolate(self, g: list[list[float]], batch: float, tokens: float) -> float:
        bi, bw, bs = self._weights(self._lb, math.log(max(batch, 1)))
        ti, tw, ts = self._weights(self._lt, math.log(max(tokens, 1)))
        nt = len(self._lt)
        rows = [(r[ti], r[min(ti + 1, nt - 1)]) for r in (g[bi], g[min(bi + 1, len(g) - 1)])]
        along_t = [(a * (1 - tw) + b * tw) * ts for a, b in rows]
        return max((along_t[0] * (1 - bw) + along_t[1] * bw) * bs, 1e-9)

    def to_dict(self) -> dict:
        return {"batches": self.batches, "tokens": self.tokens, "seconds": self.seconds, "meta": self.meta,
                "plain": self.plain}

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: Path) -> CostTable:
        return cls(**json.loads(path.read_text()))


def measure_cost_table(backend, batches: tuple[int, ...] = DEFAULT_BATCHES,
                       tokens: tuple[int, ...] = DEFAULT_TOKENS, past_len: int = 128, reps: int = 3,
                       meta: dict | None = None, progress: bool | None = None,
                       draft_adapter: bool = True, order: str = "passes") -> CostTable:
    """Time packed forwards on ``backend`` (uses slots 0 … B-1: call only while no request runs).

    Every cell is timed ``reps`` times after a warm-up forward, in passes over the whole grid (each
    pass probes every cell once), and keeps its best time. Timed cell after cell, a burst of load on
    a shared CPU (another process, a first use's own disk writes) spoilt every timing of the cells it
    overlapped: on the AVX2-only EPYC a first-use table priced the AR step 1.5x its cost and 8 tokens
    1.2x, the chooser took 8-token blocks where 4 paid, and the cached table kept `recguide generate`
    on them in every later run. Passes spread each cell's timings over the whole measurement.
    ``order="cells"`` times cell after cell as before, to measure the difference
    (``scripts/check_cost_probe.py``).

    ``progress``: a progress bar on stderr (None: only when stderr is a terminal). ``draft_adapter``:
    whether the model has one; without it a draft step costs what a plain step costs, so the gated
    probes are skipped (half the start-up time). A cell whose warm-up forward takes longer than
    :data:`LONG_PROBE_S` keeps that one timing: such a forward is compute-bound (what a warm-up warms
    is a small part of it), and those cells are most of the table's time.
    """
    from tqdm import tqdm

    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    if order not in ("passes", "cells"):
        raise ValueError(f"order must be 'passes' or 'cells', got {order!r}")
    batches = tuple(b for b in batches if b <= backend.max_slots) or (1,)
    tokens = tuple(t for t in tokens if t <= backend.slot_capacity // 2) or (1,)
    past_len = min(past_len, backend.slot_capacity - max(tokens))
    rng = np.random.default_rng(0)

    def probe_batch(b: int, t: int, gate: np.ndarray) -> ForwardBatch:
        return ForwardBatch(
            slots=np.arange(b), past_lens=np.full(b, past_len),
            input_ids=rng.integers(0, backend.vocab_size, size=(b, t)),
            position_ids=np.broadcast_to(past_len + np.arange(t), (b, t)).copy(),
            intra_mask=np.broadcast_to(np.tri(t, dtype=bool), (b, t, t)).copy(),
            draft_gate=gate, want_logits=np.zeros(b, bool))

    # Cells (b, t, gated): a wider cell is also probed with the draft gate on when the model has an adapter.
    probes: dict[tuple[int, int, bool], ForwardBatch] = {}
    between = {t: _power_of_two_neighbours(t, tokens) for t in tokens}
    for b in batches:
        for t in tokens:
            if b > FINE_TOKENS_MAX_BATCH and between[t] is not None:
                continue  # interpolated below
            probes[(b, t, False)] = probe_batch(b, t, np.zeros((b, t), np.float32))
            gated = probe_draft_gate(b, t)
            if draft_adapter and gated.any():
                probes[(b, t, True)] = probe_batch(b, t, gated)

    def timed(cell) -> float:
        t0 = time.perf_counter()
        backend.forward(probes[cell])
        return time.perf_counter() - t0

    # (cell, warm-up?) in the order they run: a warm-up pass, then `reps` passes over the grid.
    if order == "passes":
        schedule = [(c, True) for c in probes] + [(c, False) for _ in range(reps) for c in probes]
    else:
        schedule = [(c, w) for c in probes for w in [True] + [False] * reps]
    best: dict[tuple[int, int, bool], float] = {}
    final: set = set()
    bar = tqdm(total=len(schedule), desc="step-cost table", unit="probe",
               disable=None if progress is None else not progress, leave=False)
    for cell, warmup in schedule:
        bar.update(1)
        if cell in final:
            continue
        seconds = timed(cell)
        if warmup:
            if seconds > LONG_PROBE_S:  # compute-bound: the caches it warms are a small part of its time
                best[cell] = seconds
                final.add(cell)
        else:
            best[cell] = min(best.get(cell, math.inf), seconds)
    bar.close()
    for b in batches:
        for t in tokens:
            if (b, t, False) in probes or between[t] is None:
                continue
            lo, hi = between[t]
            w = (math.log(t) - math.log(lo)) / (math.log(hi) - math.log(lo))
            for gated in (False, True):
                if (b, lo, gated) in best and (b, hi, gated) in best:
                    best[(b, t, gated)] = best[(b, lo, gated)] * (1 - w) + best[(b, hi, gated)] * w
    plain = monotone_envelope([[best[(b, t, False)] for t in tokens] for b in batches])
    seconds = monotone_envelope([[best.get((b, t, True), best[(b, t, False)]) for t in tokens] for b in batches])
    # The adapter only adds work: a gated cell measured below its plain twin measured noise.
    seconds = [[max(a, p) for a, p in zip(ra, rp)] for ra, rp in zip(seconds, plain)]
    return CostTable(list(batches), list(tokens), seconds, dict(meta or {}, past_len=past_len), plain)


def _power_of_two_neighbours(t: int, tokens: tuple[int, ...]) -> tuple[int, int] | None:
    """The grid's nearest powers of two below and above ``t``, where ``t`` is not one and both are in the grid."""
    if t & (t - 1) == 0:
        return None
    lo = [u for u in tokens if u < t and u & (u - 1) == 0]
    hi = [u for u in tokens if u > t and u & (u - 1) == 0]
    return (max(lo), min(hi)) if lo and hi else None


def monotone_envelope(seconds: list[list[float]]) -> list[list[float]]:
    """Each cell raised to the largest cell with fewer rows and fewer tokens.

    A step with more rows or more tokens does the same work and more, so it never costs less; a
    probe that says otherwise measured noise (two timings of a few milliseconds), and a table that
    prices 8 tokens below 4 sends the chooser to the wrong block.
    """
    out = [list(map(float, row)) for row in seconds]
    for i, row in enumerate(out):
        for j in range(len(row)):
            row[j] = max(row[j], row[j - 1] if j else 0.0, out[i - 1][j] if i else 0.0)
    return out


def probe_draft_gate(batch: int, tokens: int) -> np.ndarray:
    """Draft gate of a probe step: none for AR (1 token per row), else the later half of the tokens."""
    if tokens <= 1:
        return np.zeros((batch, tokens), np.float32)
    return (np.arange(batch * tokens).reshape(batch, tokens) >= (batch * tokens) // 2).astype(np.float32)


def cached_cost_table(backend, key: dict, cache_dir: Path | None = None,
                      after_measure: Callable[[CostTable], None] | None = None, **kwargs) -> CostTable:
    """Load the table for ``key`` from the cache directory, or measure and store it.

    ``after_measure`` is called with a table just measured (not one loaded): its probes wrote the K/V of
    the backend's slots at positions ``table.meta["past_len"]`` and on, which a prefix cache must forget."""
    import hashlib

    from ..cache import cache_root

    cache_dir = cache_dir or cache_root()
    key = dict(key, probe_version=PROBE_VERSION)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir / f"cost_{digest}.json"
    if path.is_file():
        try:
            return CostTable.load(path)
        except (OSError, ValueError, TypeError):
            pass
    log.info("measuring the step-cost table on this backend (once; cached as %s)", path)
    t0 = time.perf_counter()
    table = measure_cost_table(backend, meta=key, **kwargs)
    if after_measure is not None:
        after_measure(table)
    try:
        table.save(path)
    except OSError as exc:
        log.warning("could not cache the step-cost table at %s: %s", path, exc)
    log.info("step-cost table measured in %.1f s", time.perf_counter() - t0)
    return table
