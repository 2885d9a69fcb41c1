"""Hand-built requests and a driver for the peer-controller tests (plain data, no model)."""

from __future__ import annotations

import numpy as np

from recguide_trt.runtime.mismatch import MismatchPrediction
from recguide_trt.runtime.params import SamplingParams
from recguide_trt.runtime.plan import Kind
from recguide_trt.runtime.policies.base import StepContext
from recguide_trt.runtime.request import Draft, Request, Round


def request(rid: int = 0, remaining: int = 100, block: int | None = None, block_size: int | None = None) -> Request:
    """A running request; ``block`` gives it a pending draft of that block."""
    r = Request(rid, [5, 6, 7], SamplingParams(max_tokens=remaining, block_size=block_size), np.random.default_rng(0))
    r.seed, r.cache_len = 9, 3
    if block is not None:
        r.draft = Draft([11] * (block - 1), MismatchPrediction(-1, -1))
    return r


def batch_block(policy, concurrency: int, step: int = 0) -> int:
    """The block ``policy`` gives a fresh request at this load (1 = AR)."""
    (work,) = policy.plan([request()], StepContext(concurrency, step))
    return 1 if work.kind is Kind.AR else work.block


def verify_batch(policy, rounds: list[tuple[int, int]], concurrency: int | None = None) -> None:
    """Report one verify batch, ``rounds`` = [(block, accepted), ...], then start the next step
    (the peers update on the batch when the next plan begins)."""
    for i, (block, accepted) in enumerate(rounds):
        policy.observe(request(i), Round(block, accepted), None)
    policy.plan([], StepContext(concurrency if concurrency is not None else len(rounds), 0))
