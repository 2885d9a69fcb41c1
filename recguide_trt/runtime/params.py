"""Per-request generation parameters."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .logprobs import MAX_LOGPROBS

PEER_CONTROLLERS = ("trtllm-schedule", "sglang-adaptive", "sglang-autospec", "vllm-adaptive-k")
"""Other engines' load-adaptive speculation controllers, re-implemented on this engine
(``runtime/policies/``: TensorRT-LLM's draft_len_schedule, SGLang's adaptive and auto-spec, vLLM's
Adaptive K): one draft length for the whole batch each step, no overlap."""
POLICIES = ("ar", "linearspec", "recguide", *PEER_CONTROLLERS)
"""Decoding policies a request may ask for."""


@dataclass
class SamplingParams:
    """How one request is decoded. Validated by :meth:`validate` at submission."""

    max_tokens: int = 128
    """New tokens to generate at most (the EOS token, when emitted, ends generation early)."""
    temperature: float = 0.0
    """0 = greedy; > 0 samples (speculative sampling keeps the AR distribution)."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; applies to both the AR target and the draft."""
    seed: int | None = None
    """Sampling seed of this request (None: drawn from the engine's generator)."""
    policy: str = "recguide"
    """"ar", "linearspec" (fixed block), "recguide" (load-adaptive) or one of the peer controllers
    (:data:`PEER_CONTROLLERS`)."""
    block_size: int | None = None
    """Draft block size L >= 2 for linearspec (default: the model's), or the largest block recguide may use."""
    stop_at_eos: bool = True
    """Stop when the model emits its EOS token."""
    logprobs: int | None = None
    """Return each output token's log-probability and this many most likely alternatives (0 … 20) at its
    position; None: none. The model's own distribution (temperature 1, no top-p): the same under every policy."""
    prompt_logprobs: int | None = None
    """The same for every prompt token after the first (this many alternatives, 0 … 20); None: none. The prefill
    then computes the head at every prompt position, and this request reuses no cached prefix."""

    def validate(self) -> None:
        """Raise a ValueError naming the field; numpy scalars are accepted (and stored as Python numbers)."""
        self.max_tokens = _integer("max_tokens", self.max_tokens, "a positive integer")
        if self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        self.temperature = _real("temperature", self.temperature, ">= 0 (0 = greedy)")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        self.top_p = _real("top_p", self.top_p, "in (0, 1]")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.policy, str) or self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.block_size is not None:
            block_msg = ("an integer >= 2 (a draft needs a seed and at least one masked position)")
            self.block_size = _integer("block_size", self.block_size, block_msg)
            if self.block_size < 2:
                raise ValueError(f"block_size must be {block_msg}, got {self.block_size!r}")
        if self.seed is not None:
            self.seed = _integer("seed", self.seed, "an integer >= 0 or None")
            if self.seed < 0:
                raise ValueError(f"seed must be an integer >= 0 or None, got {self.seed!r}")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None:
                v = _integer(name, v, f"an integer in [0, {MAX_LOGPROBS}] or None")
                if not 0 <= v <= MAX_LOGPROBS:
                    raise ValueError(f"{name} must be an integer in [0, {MAX_LOGPROBS}] or None, got {v!r}")
                setattr(self, name, v)
        if not isinstance(self.stop_at_eos, (bool, np.bool_)):
            raise ValueError(f"stop_at_eos must be True or False, got {self.stop_at_eos!r}")
        self.stop_at_eos = bool(self.stop_at_eos)


def _integer(name: str, v, expect: str) -> int:
    # numbers.Integral covers numpy integers; bool is an int subclass but never meant as a count.
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError(f"{name} must be {expect}, got {type(v).__name__} {v!r}")
    return int(v)


def _real(name: str, v, expect: str) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError(f"{name} must be a number {expect}, got {type(v).__name__} {v!r}")
    v = float(v)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number {expect}, got {v}")
    return v
