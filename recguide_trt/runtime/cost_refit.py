"""Online refit of the start-up cost table from the step times the engine actually measures.

The start-up table is timed on an idle backend with synthetic rows at one prefix length. Serving
differs (longer and mixed contexts, other work on the machine), and a few percent of error
flips a block choice when two options are close. Each executed decode forward reports its shape
and seconds, and log(measured / table) is split in two:

* a **shared load** term, one for the whole table, that every observation of a measured cell moves
  fast (:data:`COMMON_ALPHA`): other work on the machine slows every shape alike;
* a **per-cell** offset (nearest grid point in log space) that moves slowly (``alpha``): what a
  shape costs relative to the table, apart from the load.

A cell's correction is exp(shared + offset). Kept per cell alone, a burst of slow steps priced
only the cells that happened to run during it: the policy then avoided them, so they were never
measured again and stayed overpriced after the burst. On SmolLM2 at C = 1 (docs/drafter.md, the closed
loop) one sweep ended with the 1- and 8-token verify cells at +28 % / +37 % and RecGuide ran
0.91x L8; its repeat, with every cell within 9 %, ran 1.02x. With the shared term the burst moves
every cell's price alike, and the cells' relative prices (what a choice compares) barely move.

A cell not yet measured enough borrows the average offset of its batch size's measured cells (or,
with none, of all measured cells): serving shifts every cell of a row alike (longer contexts), and
a cell left at the idle table's price would look cheaper than the measured ones only because it
was never run — the chooser would be lured into it. Once it runs there, that cell is measured too.

Steps with a draft token (adapter on) and steps of verifies / AR rows only are separate cells,
as in the table (:attr:`CostTable.plain`): averaging them would price each kind as the mix the
policy happened to run.
"""

from __future__ import annotations

import math

import numpy as np

from .cost_model import CostTable
from .host_cost import HostCostModel

UPDATE_EVERY = 64
"""Observations between recomputations of the corrections (besides a cell becoming measured). A
recomputation that moves a correction bumps the version, which empties RecGuide's price and choice
memos: every 16 steps that was a measurable share of a batch-1 step on the native backend."""
MOVE = 0.01
"""Relative change of some correction that counts as a new table (bumps the version). Converged
corrections wobble by less; bumping on every recomputation re-derived RecGuide's choices (and every
512 steps its switch point, milliseconds) every 64 steps of a steady load, about 8 us of a 0.25 ms
batch-1 step on the native backend."""


COMMON_ALPHA = 0.25
"""Weight of one observation in the shared load term. Fast, so that a burst of slow steps lands
there before it leaks into the offsets of the cells that ran during it: a burst of +d on one cell
moves that cell's offset by about alpha / (alpha + COMMON_ALPHA) * d, and the others' by as much the
other way once the load is gone (with the default alpha, each by ~7 % of the burst)."""

STALE_HALF_LIFE = 1000
"""Observations (of any cell) after which what a cell's past samples say counts half. A cell the
policy stopped running keeps its last price, and when it runs again (RecGuide tries a near-tie now
and then) its next samples weigh as a young cell's would, instead of alpha each: at alpha 0.02 a
cell 10 % off needed ~70 samples to move three quarters of the way."""

MAX_MEMO = 4096
"""Shapes whose nearest cell is memoised. A packed step's width is its rows' mean length, so a long
run sees many distinct shapes; the memo starts over rather than grow without bound."""


class RefittedCostTable:
    """A :class:`CostTable` whose cells are rescaled by measured step times."""

    def __init__(self, table: CostTable, alpha: float = 0.02, min_samples: int = 8):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must lie in (0, 1], got {alpha}")
        self.table = table
        self.alpha = alpha
        self.min_samples = min_samples
        shape = (2, len(table.batches), len(table.tokens))  # [adapter off / on, batch, tokens]
        self.log_ratio = np.zeros(shape)
        """Per cell: log(measured / table) apart from the shared load (the cell's offset)."""
        self.common = 0.0
        """The shared load term: log(measured / table) that every cell shows at the moment."""
        self.samples = np.zeros(shape, dtype=np.int64)
        self._recent = np.zeros(shape)      # samples per cell, decayed by the observations since (STALE_HALF_LIFE)
        self._last = np.zeros(shape, dtype=np.int64)
        self._observations = 0
        self._factor = [[[1.0] * shape[2] for _ in range(shape[1])] for _ in range(2)]
        self._lb = [math.log(b) for b in table.batches]
        self._lt = [math.log(t) for t in table.tokens]
        self._cells: dict[tuple[float, float], tuple[int, int]] = {}
        self._pending = 0
        self._version = 0
        self.host = HostCostModel()
        """The engine's host work per step, priced on top of the forward (:mod:`.host_cost`)."""

    @property
    def version(self) -> int:
        """Changes whenever the corrections or the host model change (callers memoise on it)."""
        return self._version + self.host.version  # both only grow: the sum changes when either does

    @property
    def meta(self) -> dict:
        return self.table.meta

    def _cell(self, batch: float, tokens: float) -> tuple[int, int]:
        key = (batch, tokens)
        cell = self._cells.get(key)
        if cell is None:
            if len(self._cells) >= MAX_MEMO:  # packed steps' mean widths are fractional: many keys
                self._cells.clear()
            x, y = math.log(max(batch, 1)), math.log(max(tokens, 1))
            cell = self._cells[key] = (min(range(len(self._lb)), key=lambda i: abs(self._lb[i] - x)),
                                       min(range(len(self._lt)), key=lambda j: abs(self._lt[j] - y)))
        return cell

    def observe(self, batch: int, tokens: float, seconds: float, adapter: bool = True) -> None:
        """One executed forward of ``batch`` rows padded to ``tokens`` new tokens took ``seconds``
        (``adapter``: whether any of its tokens was a draft token). On a backend that packs its rows,
        ``tokens`` is the rows' mean length (fractional): what the forward cost follows there."""
        if seconds <= 0 or tokens > self.table.tokens[-1] * 1.5:
            return  # prefill-sized steps lie far off the grid
        i, j = self._cell(batch, tokens)
        k = int(bool(adapter))
        err = math.log(seconds / self.table.step_time(batch, tokens, bool(adapter)))
        n = int(self.samples[k, i, j])
        if n >= self.min_samples:  # a measured cell's surprise is the machine's load first
            self.common += COMMON_ALPHA * (err - self.common - self.log_ratio[k, i, j])
        # The first samples average plainly, then the offset follows drift slowly; samples from long
        # ago count for less (a cell not run for a while re-learns as a young one).
        self._observations += 1
        recent = self._recent[k, i, j] * 0.5 ** ((self._observations - self._last[k, i, j]) / STALE_HALF_LIFE)
        w = max(self.alpha, 1.0 / (recent + 1))
        self.log_ratio[k, i, j] += w * (err - self.common - self.log_ratio[k, i, j])
        self._recent[k, i, j] = recent + 1
        self._last[k, i, j] = self._observations
        self.samples[k, i, j] = n + 1
        self._pending += 1
        # A cell that just became measured changes its row at once; otherwise the averages move
        # slowly (alpha), and recomputing them every step would cost the step more than it gains.
        if n + 1 == self.min_samples or (n + 1 > self.min_samples and self._pending >= UPDATE_EVERY):
            self._update_factors()

    def _update_factors(self) -> None:
        self._pending = 0
        measured = self.samples >= self.min_samples
        if not measured.any():
            return
        weights = np.where(measured, self.samples, 0)
        overall = float((weights * self.log_ratio).sum() / weights.sum())
        factor = [[None] * weights.shape[1] for _ in range(2)]
        for i in range(weights.shape[1]):
            # A batch size's measured cells of either kind: serving shifts both alike.
            row_w = weights[:, i]
            prior = float((row_w * self.log_ratio[:, i]).sum() / row_w.sum()) if row_w.any() else overall
            for k in range(2):
                factor[k][i] = [math.exp(self.common + (self.log_ratio[k, i, j] if measured[k, i, j] else prior))
                                for j in range(weights.shape[2])]
        moved = max(abs(new / old - 1.0) for k in range(2) for i in range(weights.shape[1])
                    for new, old in zip(factor[k][i], self._factor[k][i]))
        if moved > MOVE:
            self._factor = factor
            self._version += 1

    def measured(self, batch: float, tokens: float, adapter: bool = True) -> bool:
        """Whether the cell nearest (batch, tokens) of that kind has ``min_samples`` measurements."""
        i, j = self._cell(batch, tokens)
        return bool(self.samples[int(bool(adapter)), i, j] >= self.min_samples)

    def correction(self, batch: float, tokens: float, adapter: bool = True) -> float:
        """Measured / table time of the cell nearest (batch, tokens) of that kind: the shared load times
        the cell's offset; until it has ``min_samples`` samples, the average offset of its batch
        size's measured cells of both kinds (else of all measured cells; else 1)."""
        i, j = self._cell(batch, tokens)
        return self._factor[int(bool(adapter))][i][j]

    def step_time(self, batch: float, tokens: float, adapter: bool = True) -> float:
        """The forward's refit price plus the host work of a step of that shape."""
        return (self.table.step_time(batch, tokens, adapter) * self.correction(batch, tokens, adapter)
                + self.host.predict(batch, tokens, adapter))

    def observe_host(self, batch: int, tokens: int, seconds: float, adapter: bool) -> None:
        """Host seconds of one decode step (packing, acceptance, streaming) of that shape."""
        self.host.observe(batch, tokens, seconds, adapter)

    def to_dict(self) -> dict:
        """The corrections (the table itself is ``self.table.to_dict()``): a measured cell's price is
        the table's times exp(common_log + log_ratio)."""
        return {"batches": self.table.batches, "tokens": self.table.tokens, "kinds": ["plain", "adapter"],
                "common_log": round(self.common, 4), "log_ratio": self.log_ratio.round(4).tolist(), "samples": self.samples.tolist(),
                "host_coef_s": self.host.coef.round(9).tolist(), "host_samples": self.host.samples}
