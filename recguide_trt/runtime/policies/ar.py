"""Plain autoregressive decoding: one token per forward, no drafting."""

from __future__ import annotations

from ..plan import Kind, Work
from ..request import Request, Round
from .base import StepContext


class ARPolicy:
    name = "ar"

    def plan(self, requests: list[Request], ctx: StepContext) -> list[Work]:
        # A pending draft (left by another policy) is still verified: it costs nothing extra.
        return [Work(r.id, Kind.VERIFY, r.draft.block) if r.draft is not None else Work(r.id, Kind.AR)
                for r in requests]

    def observe(self, request: Request, outcome: Round, hit: bool | None,
                would_hit: bool | None = None) -> None:
        pass
