"""The state of one request as it moves through the engine. Plain Python and numpy only."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from .logits_processors import adjusts_logits
from .logprobs import TokenLogprob
from .metrics import RequestMetrics
from .mismatch import MismatchPrediction
from .params import SamplingParams

HISTORY = 8
"""Verify rounds of acceptance history kept per request (the block-size chooser's features)."""


class Status(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass
class Draft:
    """A drafted block waiting for verification."""

    tokens: list[int]
    """d1 … d(L-1)."""
    flag: MismatchPrediction
    """Predicted first rejection inside this draft (drives the prospective row)."""
    q: np.ndarray | None = None
    """``[L-1, V]`` draft distributions the tokens were sampled from (sampling only)."""
    prospective: bool = False
    """Drafted by a prospective row (fused with the previous verify, on a guess of its outcome that
    came true), not by a draft forward of its own."""
    lookup: bool = False
    """Found in the request's context (prompt lookup), not drafted by the model."""

    @property
    def block(self) -> int:
        return len(self.tokens) + 1


@dataclass
class Round:
    """Outcome of one verify round, the history the block-size chooser learns from."""

    block: int
    """L of the round (1 = AR)."""
    accepted: int
    """Draft tokens accepted (0 … L-1)."""


@dataclass
class Request:
    id: int
    prompt_ids: list[int]
    params: SamplingParams
    rng: np.random.Generator
    on_tokens: Callable[[Request, list[int]], None] | None = None
    """Called from the engine thread with each batch of newly emitted tokens."""
    status: Status = Status.WAITING
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[TokenLogprob] = field(default_factory=list)
    """One per output token when ``params.logprobs`` is set (appended before ``on_tokens`` is called)."""
    prompt_logprobs: list[TokenLogprob] | None = None
    """One per prompt token after the first when ``params.prompt_logprobs`` is set (set by the prefill)."""
    slot: int = -1
    cache_len: int = 0
    """Tokens committed to this request's KV cache (prompt + all emitted but the seed)."""
    seed: int | None = None
    """Last emitted token, not yet in the cache (None before prefill)."""
    draft: Draft | None = None
    history: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    reserved_tokens: int = 0
    """KV-cache tokens reserved at admission."""
    error: str | None = None
    finish_reason: str | None = None
    """"length", "eos", "stop" (a ``stop_token_ids`` token), "cancelled" or "error"."""
    metrics: RequestMetrics = field(default_factory=RequestMetrics)

    @property
    def remaining(self) -> int:
        return self.params.max_tokens - len(self.output_ids)

    @property
    def greedy(self) -> bool:
        return self.params.temperature == 0

    @property
    def adjusts(self) -> bool:
        """Its logits are adjusted before a token is chosen (:mod:`.logits_processors`): even a greedy row is then
        decided on the host, from the adjusted logits."""
        return adjusts_logits(self.params)

    @property
    def wants_logits(self) -> bool:
        """Its rows need the forward's full logits: to sample, to adjust them, or to report log-probabilities."""
        return not self.greedy or self.params.logprobs is not None or self.adjusts

    @property
    def wants_prompt_logits(self) -> bool:
        """Its prefill needs the logits of every prompt position (``params.prompt_logprobs``)."""
        return self.params.prompt_logprobs is not None

    @property
    def done(self) -> bool:
        return self.status in (Status.FINISHED, Status.CANCELLED, Status.FAILED)
