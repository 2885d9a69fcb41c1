"""Per-request generation parameters."""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("ar", "linearspec", "recguide")
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
    """"ar", "linearspec" (fixed block) or "recguide" (load-adaptive)."""
    block_size: int | None = None
    """Draft block size L >= 2 for linearspec (default: the model's), or the largest block recguide may use."""
    stop_at_eos: bool = True
    """Stop when the model emits its EOS token."""

    def validate(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.block_size is not None and (isinstance(self.block_size, bool) or not isinstance(self.block_size, int)
                                            or self.block_size < 2):
            raise ValueError(f"block_size must be an integer >= 2 (a draft needs a seed and at least one "
                             f"masked position), got {self.block_size!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
