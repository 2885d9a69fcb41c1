"""Vanilla self-speculation (LinearSpec, DESIGN.md §2): draft a block of L, then verify it."""

from __future__ import annotations

from ..plan import Kind, Work
from ..request import Request, Round
from .base import StepContext


class LinearSpecPolicy:
    name = "linearspec"

    def __init__(self, default_block: int):
        self.default_block = default_block

    def plan(self, requests: list[Request], ctx: StepContext) -> list[Work]:
        works = []
        for r in requests:
            if r.draft is not None:
                works.append(Work(r.id, Kind.VERIFY, r.draft.block))
            else:
                works.append(Work(r.id, Kind.DRAFT, r.params.block_size or self.default_block))
        return works

    def observe(self, request: Request, outcome: Round, hit: bool | None,
                would_hit: bool | None = None) -> None:
        pass
