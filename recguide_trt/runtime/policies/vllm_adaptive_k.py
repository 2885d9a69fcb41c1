"""vLLM's Adaptive K: each step, the K that maximises goodput E[accepted](K) / ITL(K, BS) (a peer, #18).

Followed: the vLLM document "Adaptive K (Online)" (``docs/features/speculative_decoding/adaptive_k.md``,
vllm-project/vllm commit 7391f105fe6be00e1ebcfa7dc5a4368f76da746c; the feature of PR #47111, open,
which supersedes the closed PR #44336 "Adaptive K*"), and its unit tests
(``tests/v1/spec_decode/test_adaptive_k.py``, commit cfee1b19e32a31554b12a70b5b88695e39738926).
The scheduler code itself (``Scheduler._compute_adaptive_k``) is not in the stored corpora; what
the document does not say is taken from the two PR descriptions and marked *assumed* below.

* cost model, in units of one target forward: ``ITL(K, BS) = 1 + K * c_draft + verify_overhead``,
  ``verify_overhead = bs_penalty * batch_size`` (constant in K: verification is padded);
* ``E_acc(K) = 1 + sum_{i=1..K} prod_{j=1..i} alpha_j`` with ``alpha_j`` a per-position EMA of the
  *conditional* acceptance rate at draft position j (``ema_alpha`` 0.3); untracked positions use
  ``alpha_prior`` (0.85);
* goodput ``E_acc(K) / ITL(K, BS)``; ``K = 0`` (no speculation, goodput 1) when no K >= 1 reaches
  1.0 (needs ``min_tokens = 0``, the default); K at most ``num_speculative_tokens``;
* ``cooldown_steps`` (2): steps to wait after a K change before the next one;
* defaults ``c_draft`` 0.1144 (profiled for 0.5B -> 7B AWQ on an RTX 4050), ``bs_penalty`` 0.002.

From the PR descriptions (assumed details): the per-position EMA is fed once per
``ema_window_steps`` (10) steps with the window's accepted/tried ratio per position ("EMA
accumulates over 10 steps"), starting from the prior; a new K replaces the previous one only when
``|ΔK| > hysteresis`` (1, "cooldown + hysteresis (|ΔK| > 1)"); PR #44336 explored with ε = 10%
(a step run at the largest K so every position keeps being measured) — off here by default
(``explore_prob`` 0) because the document does not list it. A round of K drafted tokens with ``a``
accepted counts positions 1..a as accepted and position a + 1 (if a < K) as rejected; later
positions are not observed. The DSD cap (``min(adaptive_k, DSD's K)``) is not modelled.

Adapted to diffusion drafting: draft length K is a block ``L = K + 1`` drafted in one masked
forward and verified in a second forward (:mod:`.peer_common`); K is capped at ``max_block - 1``.
vLLM's ``ITL(K, BS)`` (K small-draft forwards plus a target forward) becomes, once the engine has
measured its cost table (``policy.cost``), the measured price of a round relative to an AR step:
``ITL(K, B) = (T(B, L, adapter) + T(B, L, plain)) / T(B, 1, plain)`` — the batch-size effect is in
the table, so ``c_draft`` and ``bs_penalty`` are not used then. Goodput ``E_acc(K) / ITL`` is then
tokens per AR-step of time, and K = 0 (AR, goodput 1) wins when no round beats it. Before the
table is assigned (``cost is None``) the document's formula with ``c_draft`` and ``bs_penalty`` is
used. The batch size is the live concurrency. AR rounds are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost_model import CostTable
from ..request import Round
from .base import StepContext
from .peer_common import BatchDraftLengthPolicy, block_for_draft_len


@dataclass
class VllmAdaptiveKConfig:
    """Knobs of vLLM's Adaptive K (``--speculative-config`` keys ``adaptive_k_*``)."""

    num_speculative_tokens: int | None = None
    """Largest K (vLLM's ``num_speculative_tokens``). None: ``max_block - 1``; capped at it."""
    ema_alpha: float = 0.3
    """``adaptive_k_ema_alpha``: EMA smoothing factor of the per-position acceptance (0 slow, 1 raw)."""
    c_draft: float = 0.1144
    """``adaptive_k_c_draft``: draft-forward / target-forward time ratio (used only without a cost table)."""
    min_tokens: int = 0
    """``adaptive_k_min_tokens``: smallest K (0 allows disabling speculation)."""
    cooldown_steps: int = 2
    """``adaptive_k_cooldown_steps``: steps to wait after a K change."""
    bs_penalty: float = 0.002
    """``adaptive_k_bs_penalty``: verification overhead per request of the batch (used only without a cost table)."""
    alpha_prior: float = 0.85
    """``adaptive_k_alpha_prior``: acceptance rate assumed for positions not yet tracked."""
    ema_window_steps: int = 10
    """Verify steps whose per-position counts are pooled into one EMA update (PR descriptions; assumed)."""
    hysteresis: int = 1
    """A new K replaces the current one only when ``|ΔK| > hysteresis`` (PR #44336; assumed)."""
    explore_prob: float = 0.0
    """Chance per step of drafting at the largest K to keep measuring all positions (PR #44336: 0.1)."""
    seed: int = 0
    """Seed of the exploration draw."""


class VllmAdaptiveKPolicy(BatchDraftLengthPolicy):
    name = "vllm-adaptive-k"
    needs_cost = True

    def __init__(self, config: VllmAdaptiveKConfig, max_block: int):
        super().__init__(max_block)
        max_k = max_block - 1 if config.num_speculative_tokens is None else min(config.num_speculative_tokens,
                                                                               max_block - 1)
        if max_k < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {config.num_speculative_tokens}")
        if not 0 <= config.min_tokens <= max_k:
            raise ValueError(f"min_tokens must be in [0, {max_k}], got {config.min_tokens}")
        if not 0.0 <= config.ema_alpha <= 1.0 or not 0.0 <= config.alpha_prior <= 1.0:
            raise ValueError("ema_alpha and alpha_prior must lie in [0, 1]")
        if config.ema_window_steps < 1 or config.cooldown_steps < 0 or config.hysteresis < 0:
            raise ValueError("ema_window_steps must be >= 1, cooldown_steps and hysteresis >= 0")
        self.config = config
        self.max_k = max_k
        self.cost: CostTable | None = None
        # Per-position conditional acceptance EMA (draft position j + 1 at index j).
        self.alphas = np.full(max_k, config.alpha_prior, dtype=float)
        self.tracked = np.zeros(max_k, dtype=bool)
        self._acc = np.zeros(max_k)
        self._tried = np.zeros(max_k)
        self._window = 0
        self._rng = np.random.default_rng(config.seed)
        self.k = max_k  # the current K: vLLM starts at num_speculative_tokens
        self.cooldown = 0
        self.changes = 0
        self.explored = 0

    # -- estimates -----------------------------------------------------------------------------
    def expected_accepted(self, k: int) -> float:
        """``E_acc(K) = 1 + sum_i prod_{j<=i} alpha_j`` (tokens per round, bonus included)."""
        if k <= 0:
            return 1.0
        return 1.0 + float(np.cumprod(self.alphas[:k]).sum())

    def itl(self, k: int, batch_size: int) -> float:
        """Time of a round with draft length ``k`` in units of one AR (target) step."""
        if k <= 0:
            return 1.0
        if self.cost is None:
            return 1.0 + k * self.config.c_draft + self.config.bs_penalty * batch_size
        block = block_for_draft_len(k, self.max_block)
        round_time = self.cost.step_time(batch_size, block, True) + self.cost.step_time(batch_size, block, False)
        return round_time / self.cost.step_time(batch_size, 1, False)

    def goodput(self, k: int, batch_size: int) -> float:
        return self.expected_accepted(k) / self.itl(k, batch_size)

    def best_k(self, batch_size: int) -> int:
        """The goodput-maximising K (smallest on ties); 0 when no K >= 1 reaches goodput 1."""
        lo = max(1, self.config.min_tokens)
        best, best_g = lo, -np.inf
        for k in range(lo, self.max_k + 1):
            g = self.goodput(k, batch_size)
            if g > best_g + 1e-12:
                best, best_g = k, g
        if self.config.min_tokens == 0 and best_g < 1.0:
            return 0
        return best

    def choose_k(self, batch_size: int) -> int:
        """This step's K: the best one, subject to the cooldown and the hysteresis."""
        if self.cooldown > 0:
            self.cooldown -= 1
            return self.k
        best = self.best_k(batch_size)
        if abs(best - self.k) > self.config.hysteresis:
            self.k = best
            self.cooldown = self.config.cooldown_steps
            self.changes += 1
        return self.k

    # -- learning ------------------------------------------------------------------------------
    def record(self, rounds: list[Round]) -> None:
        """One verify step's rounds: per-position counts, folded into the EMA every window."""
        for r in rounds:
            drafted = min(r.block - 1, self.max_k)
            accepted = min(r.accepted, drafted)
            self._acc[:accepted] += 1
            self._tried[:accepted] += 1
            if accepted < drafted:
                self._tried[accepted] += 1
        self._window += 1
        if self._window >= self.config.ema_window_steps:
            seen = self._tried > 0
            a = self.config.ema_alpha
            rate = np.divide(self._acc, self._tried, out=np.zeros_like(self._acc), where=seen)
            self.alphas[seen] = (1 - a) * self.alphas[seen] + a * rate[seen]
            self.tracked |= seen
            self._acc[:] = 0
            self._tried[:] = 0
            self._window = 0

    # -- policy --------------------------------------------------------------------------------
    def draft_length(self, rounds: list[Round], ctx: StepContext) -> int:
        if rounds:
            self.record(rounds)
        k = self.choose_k(ctx.concurrency)
        if self.config.explore_prob > 0 and self._rng.random() < self.config.explore_prob:
            k = self.max_k
            self.explored += 1
        return k

    def stats(self) -> dict:
        return {"k": self.k, "block": block_for_draft_len(self.k, self.max_block), "cooldown": self.cooldown,
                "changes": self.changes, "explored": self.explored, "alphas": [float(a) for a in self.alphas],
                "tracked_positions": int(self.tracked.sum()), "priced_by": "formula" if self.cost is None else "cost",
                **self.block_counts()}
