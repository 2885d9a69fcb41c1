"""Prompt-lookup drafts, verified in one forward with no draft forward; a diffusion draft where the
context holds no match (see :mod:`..prompt_lookup`)."""

from __future__ import annotations

from ..plan import Kind, Work
from ..prompt_lookup import MAX_NGRAM, MIN_NGRAM, lookup_verify
from ..request import Request, Round
from .base import StepContext


class PromptLookupPolicy:
    name = "lookup"

    def __init__(self, default_block: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM):
        self.default_block = default_block
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def plan(self, requests: list[Request], ctx: StepContext) -> list[Work]:
        works = []
        for r in requests:
            if r.draft is not None:
                works.append(Work(r.id, Kind.VERIFY, r.draft.block))
                continue
            block = r.params.block_size or self.default_block
            works.append(lookup_verify(r, block, self.max_ngram, self.min_ngram) or Work(r.id, Kind.DRAFT, block))
        return works

    def observe(self, request: Request, outcome: Round, hit: bool | None,
                would_hit: bool | None = None) -> None:
        pass
