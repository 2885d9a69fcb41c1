"""Per-request generation parameters."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from .logprobs import MAX_LOGPROBS

PEER_CONTROLLERS = ("trtllm-schedule", "sglang-adaptive", "sglang-autospec", "vllm-adaptive-k")
"""Other engines' load-adaptive speculation controllers, re-implemented on this engine
(``runtime/policies/``: TensorRT-LLM's draft_len_schedule, SGLang's adaptive and auto-spec, vLLM's
Adaptive K): one draft length for the whole batch each step, no overlap."""
POLICIES = ("ar", "linearspec", "recguide", "lookup", *PEER_CONTROLLERS)
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
    """"ar", "linearspec" (fixed block), "recguide" (load-adaptive), "lookup" (prompt-lookup drafts, verified
    with no draft forward; a fixed-block diffusion draft where the context holds no match) or one of the peer
    controllers (:data:`PEER_CONTROLLERS`)."""
    block_size: int | None = None
    """Draft block size L >= 2 for linearspec and lookup (default: the model's), or the largest block recguide
    may use."""
    stop_at_eos: bool = True
    """Stop when the model emits its EOS token."""
    logprobs: int | None = None
    """Return each output token's log-probability and this many most likely alternatives (0 … 20) at its
    position; None: none. The model's own distribution (temperature 1, no top-p): the same under every policy."""
    prompt_logprobs: int | None = None
    """The same for every prompt token after the first (this many alternatives, 0 … 20); None: none. The prefill
    then computes the head at every prompt position, and this request reuses no cached prefix."""
    top_k: int = 0
    """Sample from the k most likely tokens only (0 or vLLM's -1: all). Sampling only, like ``top_p`` and
    ``min_p``."""
    min_p: float = 0.0
    """Sample only tokens whose probability is at least this share of the most likely one's, in [0, 1]."""
    stop: list[str] = field(default_factory=list)
    """Stop strings: the text ends before the first one (not returned; ``finish_reason`` "stop"). Text is the
    tokenizer's business, so ``LLM.generate`` / ``LLM.chat`` and the servers apply them, not the engine; the
    output's ``token_ids`` end with the token that completed the string, under every policy."""
    stop_token_ids: list[int] = field(default_factory=list)
    """More tokens that end the request as EOS does (finish reason "stop"; the token is emitted)."""
    min_tokens: int = 0
    """EOS and ``stop_token_ids`` are banned until this many tokens are out (clipped by ``max_tokens``)."""
    logit_bias: dict[int, float] = field(default_factory=dict)
    """Added to the named tokens' logits before the penalties (OpenAI's: each in [-100, 100])."""
    repetition_penalty: float = 1.0
    """> 0; 1 is off. A token seen in the prompt or the output has its logit divided by it where positive and
    multiplied where negative (transformers' and vLLM's rule)."""
    frequency_penalty: float = 0.0
    """In [-2, 2]: subtracted from a token's logit once per time the output holds it (OpenAI's)."""
    presence_penalty: float = 0.0
    """In [-2, 2]: subtracted from the logit of every token the output holds (OpenAI's).

    The last five change the model's logits (:mod:`.logits_processors`): the request's rows then bring their
    full logits to the host, and every policy stays equal to AR under the same settings."""

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
        self.top_k = _integer("top_k", self.top_k, "an integer >= -1 (0 or -1: all tokens)")
        if self.top_k < -1:
            raise ValueError(f"top_k must be an integer >= -1 (0 or -1: all tokens), got {self.top_k!r}")
        self.top_k = max(self.top_k, 0)  # vLLM's -1
        self.min_p = _real("min_p", self.min_p, "in [0, 1]")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        self.min_tokens = _integer("min_tokens", self.min_tokens, "an integer >= 0")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, (list, tuple)) or not all(isinstance(x, str) and x for x in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        self.stop = list(self.stop)
        if not isinstance(self.stop_token_ids, (list, tuple)):
            raise ValueError(f"stop_token_ids must be a list of token ids, got {type(self.stop_token_ids).__name__}")
        self.stop_token_ids = [_token("stop_token_ids", t) for t in self.stop_token_ids]
        if not isinstance(self.logit_bias, dict):
            raise ValueError(f"logit_bias must be a dict of token id -> bias, got {type(self.logit_bias).__name__}")
        bias = {}
        for t, v in self.logit_bias.items():
            v = _real(f"logit_bias[{t!r}]", v, "in [-100, 100]")
            if not -100 <= v <= 100:
                raise ValueError(f"logit_bias[{t!r}] must be in [-100, 100], got {v!r}")
            bias[_token("logit_bias", t)] = v
        self.logit_bias = bias
        self.repetition_penalty = _real("repetition_penalty", self.repetition_penalty, "> 0 (1: off)")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0 (1: off), got {self.repetition_penalty!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            v = _real(name, getattr(self, name), "in [-2, 2]")
            if not -2 <= v <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {v!r}")
            setattr(self, name, v)
        if not isinstance(self.stop_at_eos, (bool, np.bool_)):
            raise ValueError(f"stop_at_eos must be True or False, got {self.stop_at_eos!r}")
        self.stop_at_eos = bool(self.stop_at_eos)


def _integer(name: str, v, expect: str) -> int:
    # numbers.Integral covers numpy integers; bool is an int subclass but never meant as a count.
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError(f"{name} must be {expect}, got {type(v).__name__} {v!r}")
    return int(v)


def _token(name: str, t) -> int:
    """A token id >= 0 (the engine checks it against the vocabulary); a JSON object's key may be its digits."""
    if isinstance(t, str) and t.isdigit():
        t = int(t)
    t = _integer(name, t, "made of token ids (integers >= 0)")
    if t < 0:
        raise ValueError(f"{name} must be made of token ids (integers >= 0), got {t}")
    return t


def _real(name: str, v, expect: str) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError(f"{name} must be a number {expect}, got {type(v).__name__} {v!r}")
    v = float(v)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number {expect}, got {v}")
    return v
