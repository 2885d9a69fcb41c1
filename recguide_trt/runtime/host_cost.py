"""The engine's own work per decode step, as a price next to the forward's.

A step costs its forward (the cost table, refit online) plus the host work around it: packing the
rows, acceptance, flags of new drafts, streaming. On a fast backend that work is a sizeable share
of a step, and it grows with what the step carries — rows, tokens, draft rows — so a policy priced
by its forwards alone would overrate speculation (on the native CPU backend at C=1 a draft or
verify step's host work is several times an AR step's). The model is linear in the step's shape,
per row,

    host(B, T, adapter) = B · (c1 + c2·T + c3·[adapter])

fitted by least squares with exponential forgetting over every decode step the engine runs, so
it covers shapes RecGuide has not run itself (AR at low load, say) from the steps it has.

No per-step constant: a closed-loop load holds one batch size for thousands of steps, and the
forgetting then leaves only that B in the fit, which cannot tell a constant from a per-row cost.
With a constant the fit put a whole C=64 step's host work (3.3 ms) into it (``docs/bench`` run of
the peer-controller issue) and priced every step of every size with it, which made speculation look
almost free beside it; RecGuide then drafted at C=32 in one repeat and lost a fifth of it. Per-row
terms scale with B whatever B the fit last saw.
"""

from __future__ import annotations

import numpy as np

UPDATE_EVERY = 128
"""Observations between refits of the coefficients."""
MOVE = 0.05
"""Relative change of the coefficients that counts as a new model (bumps :attr:`HostCostModel.version`):
every version change makes RecGuide re-derive its switch point and step prices (milliseconds)."""
MIN_SAMPLES = 24
"""Observations before the model prices anything (0 until then)."""


N_FEATURES = 3


def _features(batch: float, tokens: float, adapter: bool) -> np.ndarray:
    return np.array([batch, batch * tokens, batch * float(adapter)])


class HostCostModel:
    """Online least squares of host seconds per decode step on the step's shape."""

    def __init__(self, forget: float = 0.995):
        if not 0.0 < forget <= 1.0:
            raise ValueError(f"forget must lie in (0, 1], got {forget}")
        self.forget = forget
        self._xtx = np.zeros((N_FEATURES, N_FEATURES))
        self._xty = np.zeros(N_FEATURES)
        self.samples = 0
        self._pending = 0
        self.coef = np.zeros(N_FEATURES)
        """c1 … c3 of the module docstring (seconds)."""
        self._c = (0.0,) * N_FEATURES
        self.version = 0
        """Bumped whenever the coefficients change (callers memoise on it)."""

    def observe(self, batch: int, tokens: int, seconds: float, adapter: bool) -> None:
        if seconds < 0:
            return
        x = _features(batch, tokens, adapter)
        self._xtx = self.forget * self._xtx + np.outer(x, x)
        self._xty = self.forget * self._xty + x * seconds
        self.samples += 1
        self._pending += 1
        if self.samples >= MIN_SAMPLES and self._pending >= UPDATE_EVERY:
            self._refit()

    def _refit(self) -> None:
        self._pending = 0
        # A little ridge: shapes the engine never ran (adapter steps under pure AR traffic) stay
        # near zero instead of taking arbitrary values from a singular system.
        coef = np.maximum(np.linalg.solve(self._xtx + 1e-9 * np.eye(N_FEATURES), self._xty), 0.0)
        if np.linalg.norm(coef - self.coef) > MOVE * max(np.linalg.norm(self.coef), 1e-12):
            self.coef = coef
            self._c = tuple(float(c) for c in coef)
            self.version += 1

    def predict(self, batch: float, tokens: float, adapter: bool = True) -> float:
        if self.samples < MIN_SAMPLES:
            return 0.0
        # Plain floats: RecGuide prices many cells after each version change (a numpy dot product
        # here made re-deriving its choices a few us of every batch-1 step).
        c1, c2, c3 = self._c
        return max(0.0, batch * (c1 + c2 * tokens + (c3 if adapter else 0.0)))
