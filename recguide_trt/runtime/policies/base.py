"""What every decoding policy provides: a plan per request per step, from plain data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..plan import Work
from ..request import Request, Round


@dataclass(frozen=True)
class StepContext:
    """What a policy may know about the whole engine this step."""

    concurrency: int
    """Running requests this step (the live load)."""
    step: int
    """Engine step counter."""


class Policy(Protocol):
    name: str

    def plan(self, requests: list[Request], ctx: StepContext) -> list[Work]:
        """One Work per request (same order); requests are past prefill."""
        ...

    def observe(self, request: Request, outcome: Round, hit: bool | None,
                would_hit: bool | None = None) -> None:
        """Verification outcome of ``request``'s round (hit: the prospective draft's fate, if any;
        would_hit: for a plain verify, the fate a prospective row from its draft would have had)."""
        ...

