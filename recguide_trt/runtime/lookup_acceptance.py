"""How many tokens of a prompt-lookup draft verification accepts, learned online (RecGuide's lookup value).

A lookup draft costs no forward, only its verify row's extra tokens, so whether it pays depends on how much of
it is accepted, and that varies far more than a diffusion draft's acceptance: a request copying a code snippet
accepts whole 7-token lookups round after round, one writing prose accepts the first token now and then. The
estimate is per position (the chance that token i is accepted once every token before it was), kept for each
key ``(what the request's previous lookup round did, how far back the match agrees with the context)``. A key's
estimate is shrunk towards its agreement bin's (over every previous-round outcome), a bin's towards all keys pooled
(towards an optimistic prior instead for the bin's first rounds), and the pool towards a prior. The agreement
(:attr:`~.prompt_lookup.Lookup.agree`, in :func:`agreement_bin`'s bins) is known before a request's first lookup
round, so a fresh request copying a long passage reads what such copies accepted. Plain Python and numpy.
"""

from __future__ import annotations

import numpy as np

NONE, ZERO, PARTIAL, FULL = range(4)
"""What a request's previous lookup round accepted: no such round yet, none of it, some, all of it."""

AGREE_EDGES = (2, 3, 7, 15)
"""Agreement bins' upper edges: a 2-gram alone, a 3-gram alone, 4-7, 8-15 tokens, then 16 or more. On SmolLM2's
greedy continuations of training chat and code prompts a 7-token lookup accepted 1.8 tokens on average where a
2-gram alone matched, 2.6, 3.4 and 4.6 in the next bins and 6.1 where 16 or more tokens agreed
(``scripts/eval_lookup_keys.py``, docs/eval/lookup-keys-train)."""


def agreement_bin(agree: int) -> int:
    """The bin of a match that agrees ``agree`` tokens back (see :data:`AGREE_EDGES`)."""
    return sum(agree > edge for edge in AGREE_EDGES)


PRIOR_ACCEPT = 0.5
"""The pooled estimate's prior (per position): what an agreement bin past its first :data:`EXPLORE_ROUNDS` rounds
is shrunk towards, with the rounds pooled; the rounds observed replace it within a few requests."""
PRIOR_WEIGHT = 4.0
"""Rounds the prior is worth in the pooled estimate, and the pooled estimate in each key's."""
EXPLORE_ROUNDS = 8
"""Rounds an agreement bin observes before its estimate shrinks towards all keys pooled; until then it shrinks
towards :data:`EXPLORE_ACCEPT`."""
EXPLORE_ACCEPT = 0.9
"""What an agreement bin's estimate shrinks towards for its first :data:`EXPLORE_ROUNDS` rounds. A policy whose
load makes a 0.5 prior's lookups not pay never ran one, so never learnt what they accept: in one closed-loop sweep
on the Zen 4 EPYC RecGuide at C = 8 ran AR steps only (3,040 of them), where a run that had learnt its lookups during
the clients' ramp-up ran 691 lookup verifies beside its AR rows, 1.04x AR. Optimistic at first, it tries a few and
then prices them by what they did. Per bin, not once for the policy: with one optimistic start for all keys, a fresh
policy at C = 16-64 spent its first rounds on short matches (26 % accepted), and no lookup ran after them (25
rounds in the whole sweep; docs/drafter.md)."""


class LookupAcceptance:
    """Per-position acceptance of lookup drafts of up to ``max_tokens`` tokens, per key (see the module)."""

    def __init__(self, max_tokens: int, prior: float = PRIOR_ACCEPT, weight: float = PRIOR_WEIGHT,
                 explore: int = EXPLORE_ROUNDS, explore_prior: float = EXPLORE_ACCEPT):
        if max_tokens < 1:
            raise ValueError(f"LookupAcceptance: max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.prior, self.weight = prior, weight
        self.explore, self.explore_prior = explore, explore_prior
        self._counts: dict[tuple[int, int], np.ndarray] = {}
        """Per key: ``[2, max_tokens]`` (attempts, accepts) per position."""
        self._by_agreement: dict[int, np.ndarray] = {}
        """The same per agreement bin (a key's second part), over every previous-round outcome."""
        self._pooled = np.zeros((2, max_tokens))
        self._expected: dict[tuple[int, int], list[float]] = {}
        self.rounds = 0
        """Lookup rounds observed."""
        self.tokens = 0
        """Draft tokens they proposed."""
        self.accepted = 0
        """Draft tokens they had accepted."""

    def update(self, key: tuple[int, int], proposed: int, accepted: int) -> None:
        """Record a round that verified ``proposed`` lookup tokens and accepted ``accepted`` of them."""
        proposed = min(proposed, self.max_tokens)
        accepted = min(accepted, proposed)
        counts = self._counts.setdefault(key, np.zeros((2, self.max_tokens)))
        agreement = self._by_agreement.setdefault(key[1], np.zeros((2, self.max_tokens)))
        tried = min(accepted + 1, proposed)
        for c in (counts, agreement, self._pooled):
            c[0, :tried] += 1
            c[1, :accepted] += 1
        self._expected.clear()
        self.rounds += 1
        self.tokens += proposed
        self.accepted += accepted

    def accept_probs(self, key: tuple[int, int]) -> np.ndarray:
        """P(position i accepted | positions before it accepted), i = 0 … max_tokens - 1."""
        agreement = self._by_agreement.get(key[1])
        if (0 if agreement is None else agreement[0, 0]) < self.explore:  # every round tries its first position
            p = np.full(self.max_tokens, self.explore_prior)
        else:
            p = (self._pooled[1] + self.weight * self.prior) / (self._pooled[0] + self.weight)
        for counts in (agreement, self._counts.get(key)):
            if counts is None:
                break
            p = (counts[1] + self.weight * p) / (counts[0] + self.weight)
        return p

    def expected(self, key: tuple[int, int], k: int) -> float:
        """Expected accepted tokens of a ``k``-token lookup draft under ``key`` (0 for k <= 0)."""
        if k <= 0:
            return 0.0
        table = self._expected.get(key)
        if table is None:
            table = self._expected[key] = np.cumsum(np.cumprod(self.accept_probs(key))).tolist()
        return table[min(k, self.max_tokens) - 1]

    def best_expected(self, k: int) -> float:
        """The largest :meth:`expected` over the keys observed so far and every agreement bin's (a bound: whether any
        lookup could pay)."""
        # (NONE, bin): a fresh request's key, which reads its agreement bin's estimate
        keys = list(self._counts) + [(NONE, b) for b in range(len(AGREE_EDGES) + 1)]
        return max(self.expected(key, k) for key in keys)

    @staticmethod
    def outcome(proposed: int, accepted: int) -> int:
        """The previous-round part of the next round's key."""
        return ZERO if accepted <= 0 else FULL if accepted >= proposed else PARTIAL
