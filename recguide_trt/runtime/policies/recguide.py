"""Reciprocal Guidance (DESIGN.md §3): orchestrate draft and verify budgets by load.

* Low concurrency (spare compute): verification-overlapped drafting. Each verify is fused with a
  prospective row that drafts the next block assuming the predicted mismatch (position p,
  correction token B) from the current draft's logits; on a hit the next round skips its draft
  forward.
* High concurrency (compute bound): every request gets its own block size each round from an
  online acceptance model ``V_L(h_r)`` and a cost table ``T_C`` measured on the running backend,
  maximising expected tokens per unit of step time (or tokens minus λ·time); AR (L = 1) is a legal
  choice. A step is priced as if its rows were padded to the longest (exact on backends that pad;
  an upper bound on the torch backend, which skips padding in its token-wise layers but not in
  attention — the online refit learns what the mixes RecGuide runs really cost), so the choice is
  made per step: the batch's largest block, and each request's best block up to it.
* Switching by the live concurrency, averaged over a few steps, with hysteresis; the threshold is where
  the cost table says the overlap stops paying, unless overridden.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..acceptance_model import EPOCH_ROUNDS, AcceptanceModel
from ..cost_model import CostTable
from ..lookup_acceptance import NONE, LookupAcceptance, agreement_bin
from ..mismatch import DEFAULT_TAU, FLAG_RULES
from ..plan import Kind, Prospective, Work
from ..prompt_lookup import MAX_NGRAM, MIN_NGRAM, ContextArrays, find_lookup, lookup_allowed
from ..request import Request, Round
from .base import StepContext

OVERLAP, ADAPTIVE = "overlap", "adaptive"

FIRST_REFRESH = 16
"""Steps after the policy's first step at which the switch point is first re-derived; after that the
interval doubles up to ``refresh_steps``. The first derivation sees no measured hit rate (the prior
is pessimistic), so at a steady low load a fixed 512-step interval spent the first 512 steps — a
whole benchmark cell of 8 requests — in the adaptive mode although the plain verifies had long
measured that the overlap pays."""

LOAD_STEPS = 8
"""Steps the load that picks the mode averages the live concurrency over (an exponential average). In a
closed loop of C clients a finished request leaves C - 1 in flight for a step or two before the next
arrives; read step by step, those dips put a C = switch + 1 load back into the overlap, and the
concurrency band kept it there (SmolLM2 at C = 4 on the Xeon: the overlap with blocks of 2, rated 6 %
below plain L4 by the chooser's own table, 0.97x the best fixed policy)."""

HIT_PRIOR = 8.0
"""Observations a hit-rate prior is worth: the configured prior for the pooled rate, the pooled rate
for each block's own."""

EXPLORE_EVERY = 4
"""Chances (steps where no request holds a draft) between AR steps run to measure AR's own price
while its cost-table cell is unmeasured (:meth:`RecGuidePolicy._explore_ar`)."""

ORIGIN_PRIOR = 16.0
"""Rounds a block's prospective/plain acceptance ratio prior (1) is worth
(:meth:`RecGuidePolicy.prospective_ratio`)."""

TIE_EXPLORE_EVERY = 32
"""All-AR steps between rounds of the best speculative block run to measure it, while the chooser
rates that block within :data:`TIE_RATIO` of AR (:meth:`RecGuidePolicy._explore_tie`)."""
TIE_RATIO = 0.9
"""A speculative block rated at least this fraction of AR's tokens per second is a near-tie, worth
measuring now and then: a table cell off by 5-10 % decides it, and a cell the chooser never runs is
never corrected. On SmolLM2 at C = 4 the chooser rated L4 1.01x AR and ran AR, where L4 ran 1.08x
(docs/drafter.md, the closed loop on the Xeon)."""


BLOCK_GRID = (2, 3, 4, 6, 8, 12, 16, 24, 32)
"""The draft blocks RecGuide chooses among by default (with AR, up to the engine's largest block): steps of about
1.5x. Powers of two left the best fixed block of the Zen 4 EPYC's C = 1 cell out: L6 ran 1.42x AR there, L4 1.29x
and L8 1.33x (``recguide bench ... --blocks 4,6,8``, docs/drafter.md), and RecGuide, choosing among 4 and 8, read
0.967x L6. The fixed-block benchmark cells default to the same grid, so "best fixed" is an oracle over RecGuide's
own choices."""


def default_blocks(max_block: int) -> tuple[int, ...]:
    """AR and the :data:`BLOCK_GRID` blocks up to ``max_block``."""
    return tuple([1] + [b for b in BLOCK_GRID if b <= max_block])


@dataclass
class RecGuideConfig:
    """Knobs of the RecGuide policy (every one is measurable with ``recguide bench``)."""

    candidate_blocks: tuple[int, ...] | None = None
    """Block sizes a request may get (1 = AR). None: :func:`default_blocks` (AR and :data:`BLOCK_GRID` up to the
    engine's max block)."""
    flag_rule: str = "likelihood"
    """What a prospective row bets on: "likelihood" - the most likely verification outcome under
    the draft's own probabilities (:func:`~..mismatch.predict_likely_outcome`); "threshold" - the
    first position whose risk exceeds ``tau`` (DESIGN.md §3.1; what the ONNX graph's and the CUDA
    kernel's flag outputs compute)."""
    tau: float = DEFAULT_TAU
    """Mismatch-risk threshold of the "threshold" rule: a draft position is flagged when
    ``1 - (p1 - p2) > tau``."""
    overlap: str = "fused"
    """How a prospective row runs: "fused" (packed with its verify row in one forward) or "streams"
    (a separate, concurrent forward on a second stream; CPU backends run it on a worker thread)."""
    continuation: str = "mask"
    """No flagged position: "mask" drafts the block after a full accept, "skip" runs a plain verify."""
    lookup: bool = True
    """Prompt-lookup drafts (:mod:`..prompt_lookup`: no draft forward), greedy requests only. Where the context
    holds a match, a request the chooser gave AR or a draft block verifies a lookup draft instead, of the length
    that most raises the step's expected tokens per second, if any does (:meth:`RecGuidePolicy._with_lookups`:
    its acceptance is learned online, :mod:`..lookup_acceptance`). Its rounds teach the acceptance model nothing
    (it rates diffusion drafts)."""
    lookup_ngrams: tuple[int, int] = (MIN_NGRAM, MAX_NGRAM)
    """Shortest and longest n-gram a lookup matches (:func:`..prompt_lookup.find_lookup`; the longest found
    wins). The matched length is part of the lookup's acceptance key, so shorter matches are priced apart."""
    objective: str = "ratio"
    """"ratio": maximise V_L / T_C(L); "penalty": maximise V_L - penalty_lambda · T_C(L) / T_C(AR)."""
    penalty_lambda: float = 0.5
    """Cost weight of the "penalty" objective, in tokens per AR-step of time."""
    switch_concurrency: int | None = None
    """Overlap at or below this concurrency, adaptive blocks above; None derives it from the cost table."""
    hysteresis: float = 0.25
    """Half-width, in requests, of the band around ``switch + 0.5`` that the averaged load must cross to change
    the mode (:data:`LOAD_STEPS`): the overlap from ``switch + 0.5 - hysteresis`` down, the adaptive mode above
    ``switch + 0.5 + hysteresis``, the current mode in between. In [0, 0.5]; 0.5 holds a load of exactly
    ``switch + 1`` in whichever mode it came in."""
    prior_hit_rate: float = 0.0
    """Hit rate assumed for the overlap before any is measured (worth :data:`HIT_PRIOR` observations). Pessimistic
    on purpose: plain verifies measure the hit rate for free (``Decision.would_hit``), so nothing
    needs to be bought by running fused rows on a guess; overlap starts once measured hits pay."""
    refresh_steps: int = 512
    """Recompute the derived switch point every this many steps (the acceptance model learns). One
    recomputation prices every C up to max_num_seqs in Python: every 64 steps it was a large share of
    a batch-1 step on the native backend. A young policy refreshes sooner (:data:`FIRST_REFRESH`)."""
    choice_margin: float = 0.03
    """A step with a larger block must beat the best smaller one's score by this fraction. The
    inputs (cost table, online corrections, acceptance estimates) are measurements with errors of a
    few percent, so near a tie the cheaper step is as likely to be right and is never worse for
    the other requests in the batch; it also keeps noise from dragging AR-bound loads into drafts."""
    warmup_rounds: int = 64
    """Draft (never AR) until the acceptance model has observed this many verify rounds: a prior
    that rates AR best would otherwise keep every request in AR, and nothing would ever be measured.
    Several rounds per request, not just first ones: a request's first round (right after the
    prompt) is its hardest, and an estimate from first rounds alone is too pessimistic."""

    def check(self, max_block: int) -> tuple[int, ...]:
        """The candidate blocks for an engine whose largest block is ``max_block``; a ``ValueError`` naming the field
        whose value the policy cannot run."""
        blocks = self.candidate_blocks or default_blocks(max_block)
        if any(b < 1 or b > max_block for b in blocks):
            raise ValueError(f"candidate_blocks {blocks} must lie in [1, {max_block}]")
        if self.overlap not in ("fused", "streams"):
            raise ValueError(f"overlap must be 'fused' or 'streams', got {self.overlap!r}")
        if self.flag_rule not in FLAG_RULES:
            raise ValueError(f"flag_rule must be one of {', '.join(FLAG_RULES)}, got {self.flag_rule!r}")
        if self.continuation not in ("mask", "skip"):
            raise ValueError(f"continuation must be 'mask' or 'skip', got {self.continuation!r}")
        if not 0.0 <= self.hysteresis <= 0.5:
            raise ValueError(f"hysteresis must be in [0, 0.5] (requests), got {self.hysteresis}")
        if self.choice_margin < 0:
            raise ValueError(f"choice_margin must be >= 0, got {self.choice_margin}")
        lo, hi = self.lookup_ngrams
        if not 1 <= lo <= hi:
            raise ValueError(f"lookup_ngrams must be (shortest, longest) with 1 <= shortest <= longest, "
                             f"got {self.lookup_ngrams}")
        if self.objective not in ("ratio", "penalty"):
            raise ValueError(f"objective must be 'ratio' or 'penalty', got {self.objective!r}")
        return blocks


class RecGuidePolicy:
    name = "recguide"
    needs_cost = True

    def __init__(self, config: RecGuideConfig, max_block: int, mask_token_id: int, cost: CostTable | None = None,
                 max_concurrency: int = 64):
        self.config = config
        blocks = config.check(max_block)
        self.blocks = tuple(sorted(set(blocks)))
        self.mask_token_id = mask_token_id
        self.acceptance = AcceptanceModel(max(self.blocks))
        self.cost = cost
        self.max_concurrency = max_concurrency
        self.hits = 0
        self.prospective = 0
        self.counterfactual = 0
        self.counterfactual_hits = 0
        self._block_hits: dict[int, list[int]] = {}
        """Per verified block size: [hits, observations] (fused rounds and plain verifies' would-be hits)."""
        self._origin: dict[tuple[int, bool], list[float]] = {}
        """Per (block, drafted by a prospective row): [rounds, tokens emitted], for :meth:`prospective_ratio`."""
        self.mode: str | None = None
        self.load: float | None = None
        """The live concurrency averaged over about :data:`LOAD_STEPS` steps: what picks the mode."""
        self._switch: int | None = config.switch_concurrency
        self._last_refresh = -(10**9)
        self._first_step: int | None = None
        self._switch_state: tuple | None = None
        self._decision_bin: dict[int, int] = {}
        self._memo: dict = {}
        self._memo_state: tuple | None = None
        self._warm = False
        self._since_explore = 0
        self._since_tie = 0
        self.tie_rounds = 0
        """Rounds run by :meth:`_explore_tie` (a statistic)."""
        self._prices: dict[tuple[int, int], float] = {}
        self._price_state: tuple | None = None
        self.mode_steps = {OVERLAP: 0, ADAPTIVE: 0}
        self.packed = False
        """Whether a step costs what its real tokens cost (the backend packs rows: ``packs_rows``) rather than its
        rows padded to the longest. The engine sets it from its backend; it prices lookup rows, which change one
        row's width (the chooser's own steps are priced padded, see the module)."""
        self.lookups = LookupAcceptance(max(1, max_block - 1))
        self._contexts = ContextArrays()
        self.lookahead_skips = 0
        """Prospective rows not fused because the round they bet on would rather verify a lookup (_lookup_ahead)."""
        self._lookup_key: dict[int, tuple[int, int]] = {}
        """Per request with a lookup verify planned: its :class:`LookupAcceptance` key."""
        self._lookup_prev: dict[int, int] = {}
        """Per request: what its last lookup round accepted (part of the next one's key)."""
        self._unsettled_hit: dict[int, tuple[int, bool]] = {}
        """Per request whose last round counted a (would-be) prospective hit: (verified block, whether a fused row
        made it); :meth:`_settle_hits` takes the hit back where the next round verifies a lookup instead."""
        self.lookup_lost_hits = 0
        """Hits taken back because the round after them verified a lookup (:meth:`_settle_hits`; a statistic)."""

    # -- estimates -----------------------------------------------------------------------------
    @property
    def hit_rate(self) -> float:
        """Estimated prospective hit rate, all blocks pooled: fused rounds' hits plus plain verifies'
        would-be hits."""
        hits, n = self.hits + self.counterfactual_hits, self.prospective + self.counterfactual
        return (hits + HIT_PRIOR * self.config.prior_hit_rate) / (n + HIT_PRIOR)

    def block_hit_rate(self, block: int) -> float:
        """Estimated hit rate of a prospective row beside a ``block``-token verify, shrunk towards the
        pooled rate (worth :data:`HIT_PRIOR` observations).

        It falls steeply with the block: the row bets on one verification outcome, and a longer
        block has more of them. Measured on SmolLM2 at C = 1 with overlap forced (16 chat + code
        prompts): 0.78 / 0.53 / 0.40 / 0.22 / 0.19 at L = 2 / 3 / 4 / 6 / 8. One pooled rate priced
        L8's fused rows with L4's hits, and RecGuide paid for 16-token forwards that rarely hit.

        The prior is the pooled rate, or the acceptance model's chance that every draft token of the block
        is accepted where that is larger (:meth:`full_accept_share`: the bet on a full accept hits that
        often, and the likelihood rule bets on the likeliest outcome). Pooled alone, a block never verified
        plainly borrowed the rate of the block that was: on the Zen 4 EPYC a fresh engine drafted L8 in the
        adaptive mode, its pooled rate read ~0.2, L4's overlap (0.48 once measured, 1.03-1.08x plain L8
        there) was priced at 0.2, never run, never measured (docs/drafter.md).
        """
        hits, n = self._block_hits.get(block, (0, 0))
        prior = max(self.hit_rate, self.full_accept_share(block))
        return (hits + HIT_PRIOR * prior) / (n + HIT_PRIOR)

    def full_accept_share(self, block: int) -> float:
        """The acceptance model's chance (all histories pooled) that a ``block``-token draft is accepted whole,
        where a prospective row bets on it (``continuation="mask"``) and the model has seen ``warmup_rounds``
        verify rounds (before that it is its prior, and no fused row is paid for on a guess); 0 otherwise."""
        if block <= 1 or self.config.continuation != "mask":
            return 0.0
        if not self._acceptance_warm():
            return 0.0
        probs = self.acceptance.accept_probs(self.acceptance.no_history)
        return float(np.prod(probs[:block - 1]))

    def _acceptance_warm(self) -> bool:
        """Whether the acceptance model has seen ``warmup_rounds`` verify rounds (its estimates, not its prior)."""
        return bool(self.acceptance.attempts[:, 0].sum() >= self.config.warmup_rounds)

    def prospective_ratio(self, block: int) -> float:
        """Tokens per round of a block drafted by a prospective row over one drafted by a draft forward,
        shrunk towards 1 (worth :data:`ORIGIN_PRIOR` rounds).

        A prospective row drafts the next block in the verify's forward, before the verify's outcome is
        known, and drafts worse: on SmolLM2 at C = 1, L4 rounds emitted 2.72 tokens after a prospective
        row and 3.05 after a draft forward (an ad-hoc count over one closed-loop cell). The acceptance
        model learns from draft-forward rounds only, and the overlap's value scales by this ratio on its
        hit share: pooled, the prospective rounds pulled the estimate the adaptive mode uses down to
        2.94, and at C = 4 RecGuide then rated L4 a tie with AR where it ran 1.03-1.08x.
        """
        n_p, tok_p = self._origin.get((block, True), (0, 0.0))
        n_d, tok_d = self._origin.get((block, False), (0, 0.0))
        if n_d == 0:
            return 1.0
        # The draft forwards' own mean is shrunk too, towards the acceptance model's expectation for the block
        # (every block's rounds inform it): a block the policy rarely drafts plainly had a mean of a few rounds
        # as the denominator, and one such block read 1.54 (a hit "worth" half a round more) and won the overlap.
        expected = self.acceptance.expected_tokens(self.acceptance.no_history, block)
        plain = (tok_d + ORIGIN_PRIOR * expected) / (n_d + ORIGIN_PRIOR)
        return (tok_p + ORIGIN_PRIOR * plain) / (n_p + ORIGIN_PRIOR) / plain

    def _t(self, concurrency: int, tokens: int, adapter: bool = True) -> float:
        """Price of a ``concurrency`` × ``tokens`` step with (or without) a draft token in it."""
        if self.cost is None:
            return float(tokens)
        # The chooser prices the same few cells many times a step; a refit bumps its version.
        state = (getattr(self.cost, "version", 0), id(self.cost))
        if state != self._price_state:
            self._price_state, self._prices = state, {}
        key = (concurrency, tokens, adapter)
        price = self._prices.get(key)
        if price is None:
            if len(self._prices) > 4096:  # lookup rows price fractional widths: keep the memo bounded
                self._prices = {}
            price = self._prices[key] = self.cost.step_time(concurrency, tokens, adapter)
        return price

    def step_value(self, bin_: int, block: int, overlap: bool) -> float:
        """Expected tokens one request gains per engine step with ``block`` (1 = AR).

        Plain speculation spends two steps per round (draft, verify); overlapped drafting one
        step on a hit and two on a miss, and a hit's next block, drafted by the prospective row, is
        accepted less (:meth:`prospective_ratio`).
        """
        if block <= 1:
            return 1.0
        expected = self.acceptance.expected_tokens(bin_, block)
        if not overlap:
            return expected / 2.0
        h = self.block_hit_rate(block)  # the share of rounds whose draft came from a prospective row
        return expected * (1.0 - h + h * self.prospective_ratio(block)) / (2.0 - h)

    def step_time(self, concurrency: int, longest: int, overlap: bool) -> float:
        """Expected seconds of one step whose longest block is ``longest`` (rows padded to it).

        Plain speculation alternates a request's draft step (adapter on) and verify step (off); a
        step skips the adapter only when no row drafts, about ``0.5 ** C`` of the steps (exact at
        C = 1). Overlapped, every step drafts: a request's step is a fused row (2L tokens) except
        the plain draft (L tokens) that follows a miss, a share ``q = (1 - h) / (2 - h)`` of its
        steps; the step is that narrow only when every row is such a draft, about ``q ** C``.
        """
        if longest <= 1:
            return self._t(concurrency, 1, False)
        if not overlap:
            verify_only = 0.5 ** concurrency
            return (verify_only * self._t(concurrency, longest, False)
                    + (1.0 - verify_only) * self._t(concurrency, longest, True))
        h = self.block_hit_rate(longest)
        all_drafts = ((1.0 - h) / (2.0 - h)) ** concurrency
        return (all_drafts * self._t(concurrency, longest, True)
                + (1.0 - all_drafts) * self._t(concurrency, 2 * longest, True))

    def _options(self, cap: int) -> list[int]:
        opts = [b for b in self.blocks if b <= cap]
        if cap >= 2 and cap not in opts:
            opts.append(cap)  # near the end of a request: a shorter block rather than AR
        return opts or [1]

    def choose_blocks(self, keys: list[tuple[int, int]], concurrency: int, overlap: bool) -> tuple[float, list[int]]:
        """Per-request blocks for one step, and the step's score.

        Rows are padded to the longest in a packed forward, so the step costs ``T_C(longest)``
        (:meth:`step_time`) whatever the others choose: pick the batch's largest block ``Lc`` maximising
        ``sum_r value_r / T_C(Lc)`` (or ``sum_r value_r - λ·C·T_C(Lc)/T_C(1)``), each request
        taking its best block up to ``Lc``; a larger ``Lc`` replaces a smaller one only when it scores
        ``choice_margin`` better. ``keys`` are (history bin, largest block allowed).
        """
        groups: dict[tuple[int, int], int] = {}
        for k in keys:
            groups[k] = groups.get(k, 0) + 1
        memo_key = (tuple(sorted(groups.items())), concurrency, overlap)
        hit = self._memoised().get(memo_key)
        if hit is None:
            hit = self._memo[memo_key] = self._choose_padded(groups, concurrency, overlap)
        best_score, best_choice = hit
        return best_score, [best_choice[k] for k in keys]

    def _memoised(self) -> dict:
        """The chooser's memo, emptied whenever something a choice depends on has moved.

        Steady load repeats the same groups step after step, so those steps are answered from the
        memo. The estimates it depends on move slowly: the memo lives for an acceptance epoch
        (``EPOCH_ROUNDS`` verify rounds) and as many prospective-hit observations, or until the
        cost refit updates — recomputing after every round cost a CPU step about 2 %.
        """
        state = self._estimates_state()
        if state != self._memo_state or len(self._memo) > 4096:
            self._memo_state, self._memo = state, {}
        return self._memo

    def _estimates_state(self) -> tuple:
        """Changes whenever an estimate a choice depends on has moved (see :meth:`_memoised`)."""
        return (self.acceptance.epoch, (self.prospective + self.counterfactual) // EPOCH_ROUNDS,
                getattr(self.cost, "version", 0), id(self.cost))

    def all_ar(self, n_requests: int, concurrency: int) -> bool:
        """Whether :meth:`choose_blocks` (adaptive mode) gives AR to every request of any batch of
        ``n_requests`` at this load: not even the most optimistic bin's best block up to a step's
        longest block ``L`` beats AR at ``T_C(L)``, for any ``L`` (no monotonicity of the refitted
        table assumed). Then a step needs no per-request work — at high load a disabled
        speculation costs (almost) nothing (DESIGN.md §3.3).
        """
        if self.blocks[0] != 1:
            return False   # AR is not a candidate (only a request's last token gets one)
        memo = self._memoised()
        key = ("all_ar", n_requests, concurrency)
        answer = memo.get(key)
        if answer is None:
            ar = self._score(float(n_requests), concurrency, self.step_time(concurrency, 1, False))
            bins = range(self.acceptance.no_history + 1)
            best = 1.0
            answer = True
            for L in range(2, max(self.blocks) + 1):
                best = max(best, max(self.step_value(b, L, False) for b in bins))
                if self._improves(self._score(n_requests * best, concurrency, self.step_time(concurrency, L, False)),
                                  ar):
                    answer = False
                    break
            memo[key] = answer
        return answer

    def _improves(self, score: float, incumbent: float) -> bool:
        """Whether a candidate with a larger step beats the incumbent by more than ``choice_margin``
        (anything beats no incumbent, ``-inf``)."""
        if incumbent == -np.inf:
            return True
        return score > incumbent + self.config.choice_margin * abs(incumbent) + 1e-12

    def _choose_padded(self, groups: dict[tuple[int, int], int], concurrency: int,
                       overlap: bool) -> tuple[float, dict[tuple[int, int], int]]:
        best_score, best_choice = -np.inf, {}
        for cap_all in self.blocks:
            total, choice = 0.0, {}
            for (bin_, cap), n in groups.items():
                best_b, best_v = self._best_block(bin_, self._options(min(cap, cap_all)), overlap)
                choice[(bin_, cap)] = best_b
                total += n * best_v
            score = self._score(total, concurrency, self.step_time(concurrency, max(choice.values()), overlap))
            if self._improves(score, best_score):
                best_score, best_choice = score, choice
        return best_score, best_choice

    def _score(self, total: float, concurrency: int, step: float) -> float:
        """The objective of a step expected to emit ``total`` tokens in ``step`` seconds."""
        if self.config.objective == "ratio":
            return total / step
        return total - self.config.penalty_lambda * concurrency * step / self._t(concurrency, 1, False)

    def derived_switch(self) -> int:
        """The end of the run of loads C = 1, 2, ... at which overlapped drafting beats the adaptive mode (cost
        table + model): 0 where it does not beat it at C = 1.

        The run ends at the first load where the overlap loses, not at the largest load where it wins: the mode is
        one threshold on the load, and a table that rated the overlap below the adaptive mode at C = 1 but above it
        at C = 2 (its cells' noise: the two modes price different cells) put C = 1 in the overlap with the
        largest. On the Zen 4 EPYC with lookups on, such a table (overlap 147.9 against 154.1 tok/s at C = 1)
        gave a switch point of 2, and the adaptive mode read 1.06x the overlap at C = 1 and 1.12x at C = 2 in
        paired runs (docs/drafter.md, "GEMM row blocks of 32").

        Scored for C requests of the population's estimate (every bin pooled) — what
        :meth:`choose_blocks` returns for C identical keys, computed directly: each request's best
        block under a cap does not depend on C, only the step's price does. (Recomputed every
        ``refresh_steps`` for every C up to ``max_concurrency``; through the chooser that cost a
        few % of a CPU step.)
        """
        if self.config.switch_concurrency is not None:
            return self.config.switch_concurrency
        pooled = self.acceptance.no_history
        top = max(self.blocks)
        # Per mode, the distinct (block, value) each cap gives one request, in cap order.
        picks = {overlap: [self._best_block(pooled, self._options(min(top, cap)), overlap) for cap in self.blocks]
                 for overlap in (True, False)}
        switch = 0
        for c in range(1, self.max_concurrency + 1):
            best = {}
            for overlap, options in picks.items():
                best_score, best_block, prices = -np.inf, 1, {}
                for block, value in options:
                    if block not in prices:
                        prices[block] = self.step_time(c, block, overlap)
                    score = self._score(c * value, c, prices[block])
                    if self._improves(score, best_score):
                        best_score, best_block = score, block
                best[overlap] = (best_score, best_block)
            if not (best[True][1] > 1 and best[True][0] > best[False][0]):
                break
            switch = c
        return switch

    def choose_mode(self, concurrency: int, step: int) -> str:
        if self._first_step is None:
            self._first_step = step
        age = step - self._first_step
        interval = min(self.config.refresh_steps, max(FIRST_REFRESH, age // 2))
        if self._switch is None or step - self._last_refresh >= interval:
            # Unchanged estimates give the same switch point (a steady AR load observes no rounds):
            # skip the derivation, milliseconds at max_num_seqs = 64.
            state = self._estimates_state()
            if self._switch is None or state != self._switch_state:
                self._switch = self.derived_switch()
                self._switch_state = state
            self._last_refresh = step
        self.load = concurrency if self.load is None else self.load + (concurrency - self.load) / LOAD_STEPS
        mid, band = self._switch + 0.5, self.config.hysteresis
        if self._switch == 0:  # the overlap never pays: at any load
            self.mode = ADAPTIVE
        elif self.mode is None:
            self.mode = OVERLAP if self.load <= mid else ADAPTIVE
        elif self.load <= mid - band:
            self.mode = OVERLAP
        elif self.load > mid + band:
            self.mode = ADAPTIVE
        return self.mode

    # -- plans ---------------------------------------------------------------------------------
    def plan(self, requests: list[Request], ctx: StepContext) -> list[Work]:
        works = self._plan(requests, ctx)
        if self._unsettled_hit:
            self._settle_hits(requests, works)
        return works

    def _plan(self, requests: list[Request], ctx: StepContext) -> list[Work]:
        mode = self.choose_mode(ctx.concurrency, ctx.step)
        self.mode_steps[mode] += 1
        overlap = mode == OVERLAP
        if not self._warm:
            self._warm = self._acceptance_warm()
        if self._warm and not overlap and self.all_ar(len(requests), ctx.concurrency):
            tie = self._tie_blocks(requests, ctx.concurrency)
            if tie is not None:  # no request holds a draft (see _explore_tie)
                return [Work(r.id, Kind.DRAFT, b) if b > 1 else Work(r.id, Kind.AR) for r, b in zip(requests, tie)]
            return self._with_lookups(requests, [self._verify_or_ar(r) for r in requests], overlap)
        keys = []
        for r in requests:
            bin_ = self.acceptance.history_bin(r.history)
            self._decision_bin[r.id] = bin_
            keys.append((bin_, self._cap(r)))
        _, blocks = self.choose_blocks(keys, ctx.concurrency, overlap)
        if not overlap and self._explore_ar(requests, ctx.concurrency):
            blocks = [1] * len(requests)
        elif not overlap and self._warm and max(blocks) <= 1:
            blocks = self._tie_blocks(requests, ctx.concurrency) or blocks
        if not self._warm:
            blocks = [self._warmup_block(bin_, cap, ctx.concurrency, overlap) if b <= 1 else b
                      for (bin_, cap), b in zip(keys, blocks)]
        works = []
        for r, block in zip(requests, blocks):
            if r.draft is None:
                works.append(Work(r.id, Kind.AR) if block <= 1 else Work(r.id, Kind.DRAFT, block))
                continue
            prospective = self._prospective(r, block) if overlap else None
            if prospective is not None and self._lookup_ahead(r, prospective):
                prospective = None
                self.lookahead_skips += 1
            kind = Kind.FUSED if prospective is not None else Kind.VERIFY
            works.append(Work(r.id, kind, r.draft.block, prospective))
        return self._with_lookups(requests, works, overlap)

    def _settle_hits(self, requests: list[Request], works: list[Work]) -> None:
        """Take back the prospective hits whose next round verifies a lookup: the draft they made (or would have
        made) is not what that round verifies, so the fused row bought nothing.

        A fused row's hit is taken back whenever its draft gave way to the lookup; a plain verify's would-be hit
        where the lookup is worth at least what the prospective draft would be (the test :meth:`_with_lookups` puts
        such a draft to, and :meth:`_lookup_ahead`'s). Counted whole, the overlap was rated by hits the lookups
        then used up: on the Zen 4 EPYC with lookups on, 14 % of the prospective drafts pending at a step gave
        way to a lookup, and the adaptive mode ran 1.06x the overlap at C = 1 and 1.12x at C = 2 in paired runs
        that the hit rates had rated the other way at C = 2 (docs/drafter.md)."""
        for r, w in zip(requests, works):
            pending = self._unsettled_hit.pop(r.id, None)
            if pending is None or not w.lookup:
                continue
            block, fused = pending
            if not fused:
                key = self._lookup_key.get(r.id)
                bin_ = self._decision_bin.get(r.id, self.acceptance.no_history)
                if key is None or 1.0 + self.lookups.expected(key, len(w.lookup)) < self._prospective_value(bin_, block):
                    continue
                self.counterfactual_hits -= 1
            else:
                self.hits -= 1
            self._block_hits[block][0] -= 1
            self.lookup_lost_hits += 1

    # -- prompt-lookup drafts ------------------------------------------------------------------
    def _lookup_ahead(self, r: Request, p: Prospective) -> bool:
        """Whether the round a prospective row bets on would rather verify a lookup: after the bet's outcome (the
        verified tokens up to the correction and the correction; or, for a full-accept continuation, the whole draft)
        the context holds a match whose expected tokens are at least what the prospective draft is expected to give.
        Then the fused row's extra tokens buy nothing the next step would not have anyway: a plain verify now, and
        the lookup next step, found again on the real outcome. In the overlap mode such rows fused drafts that the
        next step dropped for the lookup (docs/drafter.md, "Lookups priced like any other row")."""
        if not self.config.lookup or not lookup_allowed(r):
            return False
        tokens = r.draft.tokens
        ahead = tokens if p.first_token == self.mask_token_id else [*tokens[:p.shared - 1], p.first_token]
        context = np.concatenate([self._contexts.get(r), np.asarray(ahead, dtype=np.int64)])
        found, key = self._find_lookup(r, context, max(1, self._cap(r) - 1))
        if not found:
            return False
        value = self._prospective_value(self._decision_bin.get(r.id, self.acceptance.no_history), p.block)
        return 1.0 + self.lookups.expected(key, len(found)) >= value

    def _find_lookup(self, r: Request, context: np.ndarray, k: int) -> tuple[list[int], tuple[int, int]]:
        """Up to ``k`` lookup tokens for ``r`` from ``context`` (the configured n-grams), and their
        :class:`LookupAcceptance` key: what ``r``'s last lookup round accepted, and how far back the match agrees."""
        found = find_lookup(context, k, self.config.lookup_ngrams[1], self.config.lookup_ngrams[0])
        return found.tokens, (self._lookup_prev.get(r.id, NONE), agreement_bin(found.agree))

    def _with_lookups(self, requests: list[Request], works: list[Work], overlap: bool) -> list[Work]:
        """The plan with lookup verifies where they raise the step's expected tokens per second.

        A row the chooser gave AR or a draft block, or one holding a draft its prospective row made last step (it
        cost no forward of its own), whose context holds a match may verify the found tokens instead, ``k`` of them
        for the ``k`` that scores best: the step's expected tokens (:meth:`_row_value`; a lookup row
        ``1 + E[accepted]``) over its price with the row that wide, rows considered in order, each kept only if it
        raises the score. Priced so, a lookup is worth its extra verify tokens at low load and rarely at high load,
        where each token costs about what an AR token costs. Taken whenever found, they do not pay there: the
        ``lookup`` policy (a lookup, else an 8-token diffusion draft, every round) ran 0.77x AR at C = 4 on the Zen 4
        EPYC (docs/bench/smollm2-c4-recguide-lookup-zen4); priced so, RecGuide ran 1.15x AR there
        (docs/bench/smollm2-c4-lookup-priced-zen4).
        """
        if not self.config.lookup or not works:
            return works
        B = len(works)
        widths = [self._width(w) for w in works]
        values = [self._row_value(r, w, overlap) for r, w in zip(requests, works)]
        drafting = sum(w.kind in (Kind.DRAFT, Kind.FUSED) for w in works)
        total_w, total_v, widest = float(sum(widths)), float(sum(values)), max(widths)
        if not drafting and widest == 1 and not self._lookup_may_pay(B):
            return works
        score = total_v / self._row_price(B, total_w, widest, drafting > 0)
        out = list(works)
        for i, (r, w) in enumerate(zip(requests, works)):
            free = r.draft is None or r.draft.prospective  # no draft forward of its own to waste
            if not free or not lookup_allowed(r):
                continue
            cap = self._cap(r)  # a lookup's length is priced here, not bound by the diffusion block chosen
            if cap < 2:
                continue
            found, key = self._find_lookup(r, self._contexts.get(r), cap - 1)
            if not found:
                continue
            others_w, others_v = total_w - widths[i], total_v - values[i]
            others_drafting = drafting - (w.kind in (Kind.DRAFT, Kind.FUSED))
            best, best_k, best_v = score, 0, 0.0
            for k in range(1, len(found) + 1):
                value = 1.0 + self.lookups.expected(key, k)
                trial = (others_v + value) / self._row_price(B, others_w + k + 1, max(widest, k + 1),
                                                             others_drafting > 0)
                if trial > best:
                    best, best_k, best_v = trial, k, value
            if not best_k:
                continue
            score, drafting, widest = best, others_drafting, max(widest, best_k + 1)
            widths[i], values[i] = best_k + 1, best_v
            total_w, total_v = others_w + best_k + 1, others_v + best_v
            out[i] = Work(r.id, Kind.VERIFY, best_k + 1, lookup=tuple(found[:best_k]))
            self._lookup_key[r.id] = key
        return out

    def _lookup_may_pay(self, rows: int) -> bool:
        """Whether one lookup row of the best estimate so far could raise the score of a step of ``rows`` AR rows
        (else the step looks nothing up: at high load each token costs what an AR token does)."""
        memo = self._memoised()  # emptied when the cost table moves; the key carries the lookups' own epoch
        key = ("lookup_may_pay", rows, self.lookups.rounds // EPOCH_ROUNDS)
        answer = memo.get(key)
        if answer is None:
            ar = rows / self._row_price(rows, rows, 1, False)
            answer = memo[key] = any(
                (rows + self.lookups.best_expected(k)) / self._row_price(rows, rows + k, k + 1, False) > ar
                for k in range(1, self.lookups.max_tokens + 1))
        return answer

    def _row_price(self, rows: int, tokens: float, widest: int, adapter: bool) -> float:
        """Price of a step of ``rows`` rows holding ``tokens`` tokens, the widest ``widest``: at their mean width
        where the backend packs rows (:attr:`packed`), padded to the widest where it does not."""
        return self._t(rows, tokens / rows if self.packed else widest, adapter)

    @staticmethod
    def _width(w: Work) -> int:
        """Tokens a planned row runs."""
        if w.kind is Kind.FUSED and w.prospective is not None:
            return w.block + w.prospective.block
        return w.block if w.kind in (Kind.DRAFT, Kind.VERIFY) else 1

    def _row_value(self, r: Request, w: Work, overlap: bool) -> float:
        """Expected tokens a planned row earns per step: AR 1; a drafted block its :meth:`step_value` (a round
        over its draft and verify steps); the verify of a prospective row's draft, which needs no draft step, its
        expected tokens (:meth:`prospective_ratio` of a drafted block's)."""
        if w.kind is Kind.AR:
            return 1.0
        bin_ = self._decision_bin.get(r.id, self.acceptance.no_history)
        if r.draft is not None and r.draft.prospective:
            return self._prospective_value(bin_, r.draft.block)
        return self.step_value(bin_, w.block, overlap)

    def _prospective_value(self, bin_: int, block: int) -> float:
        """Expected tokens of verifying a ``block`` a prospective row drafted (:meth:`prospective_ratio` of a drafted
        block's)."""
        return self.acceptance.expected_tokens(bin_, block) * self.prospective_ratio(block)

    def _cap(self, r: Request) -> int:
        """The largest block ``r`` may draft now (its own block size, the policy's, what is left)."""
        return min(r.params.block_size or self.blocks[-1], self.blocks[-1], max(1, r.remaining))

    def _explore_ar(self, requests: list[Request], concurrency: int) -> bool:
        """Whether this step runs AR to measure it (every ``EXPLORE_EVERY``-th chance).

        Until the refit has measured the AR cell at this load, AR borrows the correction of the
        speculative steps RecGuide does run, and on a fast backend those slow down more from the
        probe than an AR step does (seen on the native CPU backend: the borrowed price made AR look
        dearer than it was, so RecGuide never tried it and lost to plain AR). An AR step
        now and then, only when no request holds a draft (the step is then AR-shaped), lets the
        cell measure itself; once it has, the chooser decides on measured prices alone.
        """
        measured = getattr(self.cost, "measured", None)
        if measured is None or any(r.draft is not None for r in requests) or measured(concurrency, 1, False):
            return False
        self._since_explore += 1
        if self._since_explore < EXPLORE_EVERY:
            return False
        self._since_explore = 0
        return True

    def _tie_blocks(self, requests: list[Request], concurrency: int) -> list[int] | None:
        """Each request's block in a step that measures a near-tie (:meth:`_explore_tie`): the probed block,
        or AR for a request with fewer than 2 tokens left; None when this step probes nothing."""
        block = self._explore_tie(requests, concurrency)
        if block <= 1:
            return None
        return [min(block, self._cap(r)) if self._cap(r) >= 2 else 1 for r in requests]

    def _explore_tie(self, requests: list[Request], concurrency: int) -> int:
        """The block to draft this step to measure it (1: none): every ``TIE_EXPLORE_EVERY``-th step
        that the chooser gives to AR while its best speculative block, for a request of the pooled
        estimate, rates within :data:`TIE_RATIO` of AR at this load. Only when no request holds a
        draft (the round then starts cleanly); its draft and verify steps refit that block's cells.
        """
        if self.cost is None:
            return 1
        memo = self._memoised()
        key = ("tie", concurrency)  # per-request rates: the batch's size does not enter
        block = memo.get(key)
        if block is None:
            # Tokens per second of the step, AR against each block (the "ratio" objective's terms).
            ar = 1.0 / self.step_time(concurrency, 1, False)
            pooled = self.acceptance.no_history
            block, best = 1, 0.0
            for L in self.blocks:
                if L > 1:
                    rate = self.step_value(pooled, L, False) / self.step_time(concurrency, L, False)
                    if rate > best:
                        block, best = L, rate
            if best < TIE_RATIO * ar:
                block = 1
            memo[key] = block
        if block <= 1 or any(r.draft is not None for r in requests):  # no tie (high load: most steps)
            return 1
        self._since_tie += 1
        if self._since_tie < TIE_EXPLORE_EVERY:
            return 1
        self._since_tie = 0
        self.tie_rounds += 1
        return block

    def _verify_or_ar(self, r: Request) -> Work:
        """An AR step, or the verify of a draft made before the load rose (it is never wasted)."""
        if r.draft is None:
            return Work(r.id, Kind.AR)
        self._decision_bin[r.id] = self.acceptance.history_bin(r.history)
        return Work(r.id, Kind.VERIFY, r.draft.block)

    def _warmup_block(self, bin_: int, cap: int, concurrency: int, overlap: bool) -> int:
        """The draft block of a request the chooser gave AR while the acceptance model is young: the
        option with the most expected tokens per second of step (per step without a cost table).

        By tokens per step alone the largest block always won, and on the AVX2-only EPYC, where a
        1x16 forward costs 2.5 AR steps, a one-off ``recguide generate`` (19 rounds, all of them in
        the warm-up) ran 16-token rounds at 32-35 tok/s against AR's 61 and L8's 72.
        """
        options = [o for o in self._options(cap) if o > 1]
        if self.cost is None or not options:
            return self._best_block(bin_, options, overlap)[0]
        return max(options, key=lambda b: self.step_value(bin_, b, overlap) / self.step_time(concurrency, b, overlap))

    def _best_block(self, bin_: int, options: list[int], overlap: bool) -> tuple[int, float]:
        """The option with the highest step value (the first on ties) and that value; (1, -1) if none."""
        best_b, best_v = 1, -1.0
        for b in options:
            v = self.step_value(bin_, b, overlap)
            if v > best_v:
                best_b, best_v = b, v
        return best_b, best_v

    def _prospective(self, r: Request, next_block: int) -> Prospective | None:
        draft = r.draft
        if next_block < 2:
            return None
        if draft.flag.position > 0:
            return Prospective(shared=draft.flag.position, first_token=draft.flag.correction, block=next_block)
        if self.config.continuation == "mask":
            return Prospective(shared=draft.block, first_token=self.mask_token_id, block=next_block)
        return None

    def observe(self, request: Request, outcome: Round, hit: bool | None,
                would_hit: bool | None = None) -> None:
        if outcome.block <= 1:
            return  # an AR round: nothing to learn (and at high load there is one per request per step)
        if request.draft is not None and request.draft.lookup:
            # A prompt-lookup draft: its own estimate learns; the acceptance model and the hit rates rate diffusion
            # drafts.
            proposed = len(request.draft.tokens)
            key = self._lookup_key.pop(request.id, None)
            if key is not None:
                self.lookups.update(key, proposed, outcome.accepted)
            self._lookup_prev[request.id] = LookupAcceptance.outcome(proposed, outcome.accepted)
            return
        bin_ = self._decision_bin.get(request.id)
        if bin_ is None:
            bin_ = self.acceptance.history_bin(request.history)
        prospective = bool(request.draft is not None and request.draft.prospective)
        origin = self._origin.setdefault((outcome.block, prospective), [0, 0.0])
        origin[0] += 1
        origin[1] += outcome.accepted + 1
        if not prospective:  # the acceptance model rates draft forwards (see prospective_ratio)
            self.acceptance.update(bin_, outcome.block, outcome.accepted)
        if hit is not None:
            self.prospective += 1
            self.hits += int(hit)
            self._count_hit(request, outcome.block, hit, True)
        elif would_hit is not None and (request.draft.flag.position > 0 or self.config.continuation == "mask"):
            # A plain verify (request.draft is still the verified draft): count the prospective row
            # this round would have had (none for an unflagged draft under continuation="skip").
            self.counterfactual += 1
            self.counterfactual_hits += int(would_hit)
            self._count_hit(request, outcome.block, would_hit, False)

    def _count_hit(self, r: Request, block: int, hit: bool, fused: bool) -> None:
        counts = self._block_hits.setdefault(block, [0, 0])
        counts[0] += int(hit)
        counts[1] += 1
        if hit and self.config.lookup and lookup_allowed(r):  # the next round may verify a lookup instead
            self._unsettled_hit[r.id] = (block, fused)
        else:
            self._unsettled_hit.pop(r.id, None)

    def forget(self, request_id: int) -> None:
        self._decision_bin.pop(request_id, None)
        self._lookup_key.pop(request_id, None)
        self._lookup_prev.pop(request_id, None)
        self._unsettled_hit.pop(request_id, None)
        self._contexts.forget(request_id)

    def stats(self) -> dict:
        return {"switch_concurrency": self._switch, "mode": self.mode, "hit_rate": self.hit_rate,
                "block_hit_rates": {b: round(h / n, 4) for b, (h, n) in sorted(self._block_hits.items()) if n},
                "mode_steps": dict(self.mode_steps), "blocks": list(self.blocks), "tie_rounds": self.tie_rounds,
                "lookup_rounds": self.lookups.rounds, "lookahead_skips": self.lookahead_skips,
                "lookup_lost_hits": self.lookup_lost_hits,
                "lookup_accept_rate": round(self.lookups.accepted / self.lookups.tokens, 4) if self.lookups.tokens else None,
                "prospective_ratios": {b: round(self.prospective_ratio(b), 4)
                                       for b in sorted({blk for blk, pro in self._origin if pro})}}
