"""SGLang's ``--auto-spec``: an EMA of the acceptance rate per batch-size bucket steps the depth (#18).

Followed: the SGLang document "Auto-Spec: Adaptive Speculative Decoding"
(``docs/advanced_features/auto_spec.md``, sgl-project/sglang commit
8ac557f6a95379b48acabed1e4976cfce3e7934c) and ``AutoSpecEngine`` in
``python/sglang/srt/speculative/auto_spec_engine.py`` (stored sgl-project/sglang version
09f4f48cef38cf730993747cd13e08f486aafb40):

* batch-size buckets ``[1, 2, 4, 8, 16, 32, 64, 128]``; a batch size maps to the *closest* bucket
  (``_find_closest_bs``: ties go to the smaller bucket, below 1 -> 1, above 128 -> 128);
* per bucket an allowed step list (``DEFAULT_BS_STEPS_MAPPING``, the document's "Default Step
  Ranges": 1, 2, 4 -> [3, 4, 5, 6]; 8, 16, 32 -> [2, 3, 4]; 64, 128 -> [1, 2, 3, 4]), an initial
  step (``DEFAULT_INITIAL_STEPS``: 5, 5, 5, 4, 3, 3, 3, 1; clamped to the closest allowed) and a
  pair of thresholds (``DEFAULT_THRESHOLDS`` (increase, decrease): (0.55, 0.50), (0.55, 0.50),
  (0.60, 0.50), (0.80, 0.50), (0.95, 0.60), (0.91, 0.66), (0.95, 0.65), (0.95, 0.65)), overridable
  one per bucket in ascending order by ``--pos-threshold`` / ``--neg-threshold``;
* ``update`` after every decode batch (no warm-up, no interval): ``accept_rate = ((accepted +
  batch_size) / batch_size) / num_draft_tokens_per_req`` — the mean accept length *including* the
  bonus token over the tokens per request (``num_draft_tokens = num_steps + 1``); the bucket's EMA
  (``ema_alpha`` 0.3, initial 0.5) is updated; EMA >= increase threshold -> the next larger
  allowed step, EMA < decrease threshold -> the next smaller one (one step at a time);
* the step used for a batch is the current step of its closest bucket.

Left out: trimming the step set by GPU memory and syncing it with CUDA-graph capacity (start-up
concerns of the CUDA-graph implementation).

Adapted to diffusion drafting: ``num_steps`` drafted tokens is a block of ``num_steps + 1``
(:mod:`.peer_common`), clipped to ``max_block``. A "decode batch" is the set of verify rounds
observed between two ``plan`` calls; its batch size is the live concurrency of the step those
rounds were verified in (the previous ``plan``'s ``ctx.concurrency``). ``num_draft_tokens_per_req``
is the verified block ``L``; with rounds of unequal blocks (end-of-request caps) the rate is
``sum(accepted + 1) / sum(L)``, which equals SGLang's formula when the blocks agree. AR rounds are
ignored. Assumed: ``num_draft_tokens_per_req`` is ``num_steps + 1`` (SGLang's ``SpecParams`` with
top-k 1); the scheduler call site was not in the stored corpora.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ..request import Round
from .base import StepContext
from .peer_common import BatchDraftLengthPolicy

DEFAULT_BS_STEPS_MAPPING: dict[int, list[int]] = {
    1: [3, 4, 5, 6], 2: [3, 4, 5, 6], 4: [3, 4, 5, 6], 8: [2, 3, 4],
    16: [2, 3, 4], 32: [2, 3, 4], 64: [1, 2, 3, 4], 128: [1, 2, 3, 4],
}
"""SGLang's built-in batch-size bucket -> allowed ``num_steps``."""

DEFAULT_INITIAL_STEPS: dict[int, int] = {1: 5, 2: 5, 4: 5, 8: 4, 16: 3, 32: 3, 64: 3, 128: 1}
"""SGLang's built-in initial ``num_steps`` per bucket (3 for a bucket not listed)."""

DEFAULT_THRESHOLDS: dict[int, tuple[float, float]] = {
    1: (0.55, 0.50), 2: (0.55, 0.50), 4: (0.60, 0.50), 8: (0.80, 0.50),
    16: (0.95, 0.60), 32: (0.91, 0.66), 64: (0.95, 0.65), 128: (0.95, 0.65),
}
"""SGLang's built-in (increase, decrease) acceptance-rate thresholds per bucket."""


@dataclass
class SglangAutospecConfig:
    """Knobs of SGLang's auto-spec (``--speculative-config-file``, ``--pos/neg-threshold``)."""

    bs_steps_mapping: dict[int, list[int]] | None = None
    """Batch-size bucket -> allowed ``num_steps`` (the config file's per-model entry). None: the defaults."""
    pos_threshold: list[float] | None = None
    """Increase thresholds, one per bucket in ascending order (missing ones keep the default)."""
    neg_threshold: list[float] | None = None
    """Decrease thresholds, one per bucket in ascending order (missing ones keep the default)."""
    ema_alpha: float = 0.3
    """EMA smoothing factor of the per-bucket acceptance rate (fixed in SGLang)."""
    ema_init: float = 0.5
    """Initial EMA of every bucket (fixed in SGLang)."""


class SglangAutospecPolicy(BatchDraftLengthPolicy):
    name = "sglang-autospec"
    def __init__(self, config: SglangAutospecConfig, max_block: int):
        mapping = config.bs_steps_mapping or DEFAULT_BS_STEPS_MAPPING
        if any(bs < 1 or not steps or any(s < 1 for s in steps) for bs, steps in mapping.items()):
            raise ValueError(f"bs_steps_mapping needs buckets >= 1 with positive steps, got {mapping}")
        if not 0.0 < config.ema_alpha <= 1.0:
            raise ValueError(f"ema_alpha must be in (0, 1], got {config.ema_alpha}")
        super().__init__(max_block)
        self.config = config
        self.bs_steps = {bs: sorted(set(mapping[bs])) for bs in sorted(mapping)}
        self.bs_list = list(self.bs_steps)
        # Thresholds: the default of the largest default bucket <= bs, then the user's lists.
        default_bs = sorted(DEFAULT_THRESHOLDS)
        self.increase: dict[int, float] = {}
        self.decrease: dict[int, float] = {}
        for bs in self.bs_list:
            idx = min(max(bisect.bisect_right(default_bs, bs) - 1, 0), len(default_bs) - 1)
            self.increase[bs], self.decrease[bs] = DEFAULT_THRESHOLDS[default_bs[idx]]
        for values, target in ((config.pos_threshold, self.increase), (config.neg_threshold, self.decrease)):
            for bs, v in zip(self.bs_list, values or []):
                target[bs] = float(v)
        self.steps: dict[int, int] = {}
        for bs in self.bs_list:
            initial = DEFAULT_INITIAL_STEPS.get(bs, 3)
            allowed = self.bs_steps[bs]
            self.steps[bs] = initial if initial in allowed else min(allowed, key=lambda s: abs(s - initial))
        self.ema: dict[int, float] = {bs: config.ema_init for bs in self.bs_list}
        self._last_concurrency: int | None = None

    def bucket(self, batch_size: int) -> int:
        """SGLang's ``_find_closest_bs``: the nearest bucket, ties to the smaller one."""
        bs_list = self.bs_list
        if batch_size <= 0:
            return bs_list[0]
        idx = bisect.bisect_left(bs_list, batch_size)
        if idx == 0:
            return bs_list[0]
        if idx == len(bs_list):
            return bs_list[-1]
        left, right = bs_list[idx - 1], bs_list[idx]
        return left if batch_size - left <= right - batch_size else right

    def steps_for(self, batch_size: int) -> int:
        return self.steps[self.bucket(batch_size)]

    def update(self, batch_size: int, accept_rate: float) -> int:
        """One decode batch's acceptance rate (accept length incl. bonus / tokens per request);
        returns the bucket's step after the update (SGLang's ``update``)."""
        bs = self.bucket(batch_size)
        a = self.config.ema_alpha
        self.ema[bs] = a * accept_rate + (1 - a) * self.ema[bs]
        rate, current, allowed = self.ema[bs], self.steps[bs], self.bs_steps[bs]
        if rate >= self.increase[bs]:
            higher = [s for s in allowed if s > current]
            if higher:
                self.steps[bs] = higher[0]
        elif rate < self.decrease[bs]:
            lower = [s for s in allowed if s < current]
            if lower:
                self.steps[bs] = lower[-1]
        return self.steps[bs]

    def draft_length(self, rounds: list[Round], ctx: StepContext) -> int:
        if rounds and self._last_concurrency is not None:
            rate = sum(r.accepted + 1 for r in rounds) / sum(r.block for r in rounds)
            self.update(self._last_concurrency, rate)
        self._last_concurrency = ctx.concurrency
        return self.steps_for(ctx.concurrency)

    def stats(self) -> dict:
        bs = self.bucket(self._last_concurrency or 1)
        return {"bucket": bs, "steps": self.steps[bs], "steps_per_bucket": dict(self.steps),
                "ema_per_bucket": dict(self.ema), **self.block_counts()}
