"""Online estimate of accepted tokens per round from a request's recent history (DESIGN.md §3.2).

Acceptance of draft position k, given positions < k were accepted, is modelled per history bin
(the request's recent per-position acceptance rate) with Beta-prior counts learned from the
runtime's own verification outcomes. The prior of a bin's position k is the population's estimate
at k (every bin pooled) where any bin has drafted that deep, else the bin's own estimate of
position k-1; so positions a bin never drafted yet borrow what others measured there, or inherit
the deepest learned rate, instead of a fixed guess (a fixed prior would keep the chooser from
ever discovering that a larger block pays). Borrowing matters: acceptance given that a round got
that far rises with depth (0.71-0.74 at positions 2-6, 0.82-0.97 at 7-15 on the embedded model,
block 16, training-split prompts: ``scripts/eval_flag_rules.py``), so a bin that only ever drafted
8 tokens and extrapolated its position-7 rate rated block 16 too low to ever try it. A request
with no drafted round yet gets the population's estimate (every bin pooled): a bin of its own
would learn only from first rounds and, once the chooser picked AR for it, never again —
newcomers would stay AR forever. Expected tokens per round at block L:
``1 + sum_{k=1}^{L-1} prod_{j<=k} P(accept j | bin)`` (the 1 is the bonus token).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

import numpy as np

from .request import Round

EPOCH_ROUNDS = 16
"""Observed rounds per :attr:`AcceptanceModel.epoch`: the estimates move slowly, so decisions
memoised on the epoch are recomputed every this many rounds rather than after every round."""

BIN_EDGES = (0.25, 0.5, 0.65, 0.8, 0.9)
"""Upper edges of the recent-acceptance-rate bins; one more bin holds requests with no history."""


class AcceptanceModel:
    def __init__(self, max_block: int, prior_accept: float = 0.6, prior_strength: float = 4.0):
        self.max_pos = max_block
        n_bins = len(BIN_EDGES) + 2
        self.no_history = n_bins - 1
        """The bin of a request with no drafted round (estimated from all bins pooled)."""
        self.prior_accept = prior_accept
        self.prior_strength = prior_strength
        self.success = np.zeros((n_bins, max_block))
        self.attempts = np.zeros((n_bins, max_block))
        self._probs: dict[int, np.ndarray] = {}
        self._expected: dict[int, list[float]] = {}
        self.epoch = 0
        """Bumped every ``EPOCH_ROUNDS`` updates and on :meth:`refresh` (callers memoise on it)."""
        self._since_epoch = 0

    @staticmethod
    def history_bin(history: Iterable[Round]) -> int:
        acc = att = 0
        for r in history:
            if r.block <= 1:
                continue
            acc += r.accepted
            att += r.accepted + (1 if r.accepted < r.block - 1 else 0)
        if att == 0:
            return len(BIN_EDGES) + 1
        return bisect_right(BIN_EDGES, acc / att)

    def refresh(self) -> None:
        """Forget derived estimates (after editing ``success`` / ``attempts`` directly)."""
        self._probs.clear()
        self._expected.clear()
        self.epoch += 1
        self._since_epoch = 0

    def accept_probs(self, bin_: int) -> np.ndarray:
        cached = self._probs.get(bin_)
        if cached is not None:
            return cached
        pooled_attempts = self.attempts.sum(0)
        if bin_ == self.no_history:
            success, attempts, population = self.success.sum(0), pooled_attempts, None
        else:
            success, attempts = self.success[bin_], self.attempts[bin_]
            population = self.accept_probs(self.no_history)
        probs = np.empty(self.max_pos)
        prev = self.prior_accept
        for k in range(self.max_pos):
            prior = population[k] if population is not None and pooled_attempts[k] > 0 else prev
            prev = (success[k] + self.prior_strength * prior) / (attempts[k] + self.prior_strength)
            probs[k] = prev
        self._probs[bin_] = probs
        return probs

    def expected_tokens(self, bin_: int, block: int) -> float:
        """Expected tokens emitted by one verify round with a draft of ``block`` (1 = AR)."""
        if block <= 1:
            return 1.0
        table = self._expected.get(bin_)
        if table is None:
            # table[L - 1] = expected tokens at block L: built once per change of the bin's counts.
            table = self._expected[bin_] = [1.0] + (1.0 + np.cumsum(np.cumprod(self.accept_probs(bin_)))).tolist()
        return table[min(block, len(table)) - 1]

    def update(self, bin_: int, block: int, accepted: int) -> None:
        if block <= 1:
            return
        self._since_epoch += 1
        if self._since_epoch >= EPOCH_ROUNDS:
            self.epoch, self._since_epoch = self.epoch + 1, 0
        # Every bin's prior is the pooled estimate, which this round moves.
        self._probs.clear()
        self._expected.clear()
        k = min(accepted, self.max_pos)
        self.success[bin_, :k] += 1
        self.attempts[bin_, :k] += 1
        if accepted < block - 1 and accepted < self.max_pos:
            self.attempts[bin_, accepted] += 1
