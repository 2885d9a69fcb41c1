"""Per-request and aggregate serving metrics, as defined in DESIGN.md §5."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestMetrics:
    """Counters and timestamps of one request. Times are ``time.perf_counter()`` seconds."""

    prompt_tokens: int = 0
    """Prompt length in tokens."""
    cached_prompt_tokens: int = 0
    """Prompt tokens whose K/V came from the prefix cache instead of the prefill."""
    output_tokens: int = 0
    """Tokens emitted (prefill's first token included)."""
    decode_tokens: int = 0
    """Tokens emitted by decode forwards (everything after the first token)."""
    rounds: int = 0
    """Verify rounds (AR steps count as rounds of one token)."""
    drafted_tokens: int = 0
    """Draft tokens put up for verification."""
    accepted_draft_tokens: int = 0
    """Draft tokens the verifier accepted."""
    forwards: Counter = field(default_factory=Counter)
    """Backbone forwards this request took part in, by kind (prefill, ar, draft, verify, fused)."""
    prospective: int = 0
    """Fused steps that drafted a prospective block."""
    hits: int = 0
    """Prospective blocks used as the next draft (saved draft forwards)."""
    block_sizes: Counter = field(default_factory=Counter)
    """Verify rounds by block size (1 = AR)."""
    acceptance: Counter = field(default_factory=Counter)
    """Verify rounds by (block size, accepted draft tokens): per-position acceptance comes from it."""
    arrival: float = 0.0
    """Submission time."""
    first_token_time: float | None = None
    """When the first output token was produced."""
    finish_time: float | None = None
    """When the request ended."""
    token_times: list[float] = field(default_factory=list)
    """Emission time of each output token (several share a time when accepted together)."""

    @property
    def decode_forwards(self) -> int:
        return sum(n for kind, n in self.forwards.items() if kind != "prefill")

    @property
    def mal(self) -> float:
        """Mean acceptance length: tokens per verify round, bonus included (AR = 1.0)."""
        return self.decode_tokens / self.rounds if self.rounds else 0.0

    @property
    def tpf(self) -> float:
        """Decode tokens per decode forward (prefill excluded; AR = 1.0)."""
        return self.decode_tokens / self.decode_forwards if self.decode_forwards else 0.0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.prospective if self.prospective else 0.0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival

    @property
    def tpot(self) -> float | None:
        """(e2e - TTFT) / (n_out - 1)."""
        if self.finish_time is None or self.first_token_time is None or self.output_tokens < 2:
            return None
        return (self.finish_time - self.first_token_time) / (self.output_tokens - 1)

    @property
    def tokens_per_second(self) -> float | None:
        """Per-request speed: output tokens / (finish - first token)."""
        if self.finish_time is None or self.first_token_time is None or self.finish_time <= self.first_token_time:
            return None
        return self.output_tokens / (self.finish_time - self.first_token_time)

    def itl(self) -> list[float]:
        """Inter-token latencies between distinct emission events."""
        times = sorted(set(self.token_times))
        return [b - a for a, b in zip(times, times[1:])]

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens, "mal": self.mal,
            "tpf": self.tpf, "rounds": self.rounds, "drafted_tokens": self.drafted_tokens,
            "accepted_draft_tokens": self.accepted_draft_tokens, "forwards": dict(self.forwards),
            "prospective": self.prospective, "hits": self.hits, "hit_rate": self.hit_rate,
            "block_sizes": {int(k): v for k, v in self.block_sizes.items()}, "ttft": self.ttft,
            "tpot": self.tpot, "e2e": self.e2e, "tokens_per_second": self.tokens_per_second,
        }


def aggregate(metrics: list[RequestMetrics], wall_time: float | None = None) -> dict:
    """Aggregate figures of finished requests (token-weighted MAL/TPF, means of latencies)."""
    done = [m for m in metrics if m.finish_time is not None]
    if not done:
        return {"requests": 0}
    start = min(m.arrival for m in done)
    end = max(m.finish_time for m in done)
    wall = wall_time if wall_time is not None else end - start
    out_tokens = sum(m.output_tokens for m in done)
    forwards: Counter = Counter()
    blocks: Counter = Counter()
    for m in done:
        forwards.update(m.forwards)
        blocks.update(m.block_sizes)
    decode_tokens = sum(m.decode_tokens for m in done)
    rounds = sum(m.rounds for m in done)
    decode_forwards = sum(m.decode_forwards for m in done)
    prospective = sum(m.prospective for m in done)

    def mean(xs: list[float | None]) -> float | None:
        xs = [x for x in xs if x is not None]
        return float(np.mean(xs)) if xs else None

    itl = [x for m in done for x in m.itl()]
    return {
        "requests": len(done), "output_tokens": out_tokens, "wall_s": wall,
        "output_tok_s": out_tokens / wall if wall > 0 else None,
        "per_request_tok_s": mean([m.tokens_per_second for m in done]),
        "mal": decode_tokens / rounds if rounds else None,
        "tpf": decode_tokens / decode_forwards if decode_forwards else None,
        "forwards": dict(forwards), "hit_rate": (sum(m.hits for m in done) / prospective) if prospective else None,
        "block_sizes": {int(k): v for k, v in sorted(blocks.items())},
        "ttft_mean": mean([m.ttft for m in done]), "tpot_mean": mean([m.tpot for m in done]),
        "itl_mean": float(np.mean(itl)) if itl else None,
        "itl_p99": float(np.percentile(itl, 99)) if itl else None,
    }
