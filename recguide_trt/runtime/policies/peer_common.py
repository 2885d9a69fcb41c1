"""What the peer speculation controllers (issue #18) share: one draft length for the whole batch.

TensorRT-LLM's ``draft_len_schedule``, SGLang's adaptive and auto-spec controllers and vLLM's
Adaptive K all choose one draft length ``k`` per engine step for every request of the batch, and
learn from what the verify pass of a whole batch accepted. This module maps that onto the engine:

* draft length ``k`` drafted tokens <-> block ``L = k + 1`` (the seed plus ``k`` masked positions,
  drafted in one bidirectional forward and verified in one causal forward); ``k = 0`` is plain AR.
  A block above the engine's ``max_block`` is clipped to ``max_block``; near a request's end the
  block is capped by ``max(1, remaining)`` and by the request's own ``block_size`` (a block of 1
  runs AR).
* a request holding a pending draft is always verified (whatever the controller now wants).
* :class:`BatchRounds` gathers the verify rounds ``observe`` reports between two ``plan`` calls:
  they are the outcome of one verify batch, the unit the peers update on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..plan import Kind, Work
from ..request import Request, Round
from .base import StepContext


def block_for_draft_len(k: int, max_block: int) -> int:
    """Block of a draft length ``k`` (``k + 1``, clipped to ``max_block``); 1 (AR) for ``k <= 0``."""
    if k <= 0:
        return 1
    return min(k + 1, max_block)


def uniform_plan(requests: list[Request], block: int) -> tuple[list[Work], list[int]]:
    """One Work per request: verify a pending draft, else draft ``block`` (capped per request) or AR.

    Returns the works and the blocks of the new drafts (for the chosen-block counts).
    """
    works, drafted = [], []
    for r in requests:
        if r.draft is not None:
            works.append(Work(r.id, Kind.VERIFY, r.draft.block))
            continue
        b = min(block, max(1, r.remaining))
        if r.params.block_size is not None:
            b = min(b, r.params.block_size)
        if b <= 1:
            works.append(Work(r.id, Kind.AR))
        else:
            works.append(Work(r.id, Kind.DRAFT, b))
            drafted.append(b)
    return works, drafted


@dataclass
class BatchRounds:
    """The verify rounds of one engine step (AR rounds, ``block == 1``, are not kept)."""

    rounds: list[Round] = field(default_factory=list)
    """Verify rounds observed since the last ``plan``."""

    def add(self, outcome: Round) -> None:
        if outcome.block > 1:
            self.rounds.append(Round(outcome.block, outcome.accepted))

    def take(self) -> list[Round]:
        """The gathered rounds, emptying the buffer."""
        rounds, self.rounds = self.rounds, []
        return rounds


def count_block(counts: dict[int, int], blocks: list[int]) -> None:
    """Add the drafted blocks of one step to ``counts`` (block -> requests drafted with it)."""
    for b in blocks:
        counts[b] = counts.get(b, 0) + 1


class BatchDraftLengthPolicy:
    """What the four peers share as policies: each step, learn from the verify batch just observed
    and give every request that drafts the same draft length (:meth:`draft_length`)."""

    needs_cost = False

    def __init__(self, max_block: int):
        if max_block < 2:
            raise ValueError(f"max_block must be >= 2, got {max_block}")
        self.max_block = max_block
        self._rounds = BatchRounds()
        self.chosen_blocks: dict[int, int] = {}
        """Block chosen per step (1 = AR) -> steps."""
        self.drafted_blocks: dict[int, int] = {}
        """Block a request actually drafted with (after its own caps) -> drafts."""

    def draft_length(self, rounds: list[Round], ctx: StepContext) -> int:
        """This step's draft length, after learning from ``rounds`` (the last verify batch)."""
        raise NotImplementedError

    def plan(self, requests: list[Request], ctx: StepContext) -> list[Work]:
        block = block_for_draft_len(self.draft_length(self._rounds.take(), ctx), self.max_block)
        self.chosen_blocks[block] = self.chosen_blocks.get(block, 0) + 1
        works, drafted = uniform_plan(requests, block)
        count_block(self.drafted_blocks, drafted)
        return works

    def observe(self, request: Request, outcome: Round, hit: bool | None,
                would_hit: bool | None = None) -> None:
        self._rounds.add(outcome)

    def forget(self, request_id: int) -> None:
        pass

    def block_counts(self) -> dict:
        return {"chosen_blocks": dict(self.chosen_blocks), "drafted_blocks": dict(self.drafted_blocks)}
