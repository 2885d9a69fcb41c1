"""Step plans: what one request runs in one engine step. Plain data, produced by policies."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    PREFILL = "prefill"
    """Prompt tokens, causal, committed; emits the first output token."""
    AR = "ar"
    """One causal token (the seed), committed; emits one token."""
    DRAFT = "draft"
    """``[seed, MASK × (L-1)]`` bidirectional, draft adapter on; nothing committed or emitted."""
    VERIFY = "verify"
    """``[seed, d1 … d(L-1)]`` causal; accepts a prefix of the draft plus a bonus token."""
    FUSED = "fused"
    """A verify row plus a prospective draft row in one forward (RecGuide overlap)."""


@dataclass(frozen=True)
class Prospective:
    """The prospective row of a fused step: the next block, drafted before verification ends."""

    shared: int
    """Verify-row tokens the row sees: ``p`` (seed, d1 … d(p-1)) for a correction, ``L`` for a continuation."""
    first_token: int
    """The row's seed: the correction token B, or MASK for a full-accept continuation."""
    block: int
    """Tokens in the row (its seed plus ``block - 1`` masked positions)."""


@dataclass(frozen=True)
class Work:
    """One request's share of a step."""

    request_id: int
    """Which request."""
    kind: Kind
    """What it runs."""
    block: int = 1
    """Draft block size L (DRAFT); 1 for AR; the pending draft's L for VERIFY / FUSED."""
    prospective: Prospective | None = None
    """Only for FUSED."""
    lookup: tuple[int, ...] = ()
    """VERIFY of a draft found in the context (prompt lookup, no draft forward): d1 … d(L-1), which the
    engine makes the request's pending draft before the step runs."""

    @property
    def is_decode(self) -> bool:
        return self.kind is not Kind.PREFILL
