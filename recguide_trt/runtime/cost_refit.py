"""Online refit of the start-up cost table from the step times the engine actually measures.

The start-up table is timed on an idle backend with synthetic rows at one prefix length. Serving
differs (longer and mixed contexts, other work on the machine), and a few percent of error
flips a block choice when two options are close. Each executed decode forward reports its shape
and seconds; per table cell (nearest grid point in log space) an exponential average of
log(measured / table) corrects the table. Cells never run keep the table's value, so the chooser
still compares against the table where it has no measurement — once it switches there, that
cell is measured too.
"""

from __future__ import annotations

import math

import numpy as np

from .cost_model import CostTable


class RefittedCostTable:
    """A :class:`CostTable` whose cells are rescaled by measured step times."""

    def __init__(self, table: CostTable, alpha: float = 0.05, min_samples: int = 8):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must lie in (0, 1], got {alpha}")
        self.table = table
        self.alpha = alpha
        self.min_samples = min_samples
        shape = (len(table.batches), len(table.tokens))
        self.log_ratio = np.zeros(shape)
        self.samples = np.zeros(shape, dtype=np.int64)
        self._lb, self._lt = np.log(table.batches), np.log(table.tokens)
        self._memo: dict[tuple[float, float], float] = {}

    @property
    def meta(self) -> dict:
        return self.table.meta

    def _cell(self, batch: float, tokens: float) -> tuple[int, int]:
        i = int(np.argmin(np.abs(self._lb - math.log(max(batch, 1)))))
        j = int(np.argmin(np.abs(self._lt - math.log(max(tokens, 1)))))
        return i, j

    def observe(self, batch: int, tokens: int, seconds: float) -> None:
        """One executed forward of ``batch`` rows padded to ``tokens`` new tokens took ``seconds``."""
        if seconds <= 0 or tokens > self.table.tokens[-1] * 1.5:
            return  # prefill-sized steps lie far off the grid
        i, j = self._cell(batch, tokens)
        err = math.log(seconds / self.table.step_time(batch, tokens))
        n = self.samples[i, j]
        # The first samples average plainly, then the average follows drift.
        w = max(self.alpha, 1.0 / (n + 1))
        self.log_ratio[i, j] += w * (err - self.log_ratio[i, j])
        self.samples[i, j] = n + 1
        self._memo.clear()

    def correction(self, batch: float, tokens: float) -> float:
        i, j = self._cell(batch, tokens)
        return math.exp(self.log_ratio[i, j]) if self.samples[i, j] >= self.min_samples else 1.0

    def step_time(self, batch: float, tokens: float) -> float:
        key = (batch, tokens)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self.table.step_time(batch, tokens) * self.correction(batch, tokens)
        return hit

    def to_dict(self) -> dict:
        """The corrections (the table itself is ``self.table.to_dict()``)."""
        return {"batches": self.table.batches, "tokens": self.table.tokens,
                "log_ratio": self.log_ratio.round(4).tolist(), "samples": self.samples.tolist()}
