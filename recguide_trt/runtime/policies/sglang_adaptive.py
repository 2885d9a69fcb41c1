"""SGLang's ``--speculative-adaptive``: an EMA of the accept length picks a pre-built tier (a peer, #18).

Followed: the SGLang document "Adaptive Speculative Decoding"
(``docs/advanced_features/adaptive_speculative_decoding.md``, sgl-project/sglang commit
369fa46b1151bb3e8b73ddd17fee059fad72dd2f; https://docs.sglang.io/advanced_features/adaptive_speculative_decoding.html)
and the implementation it describes, ``AdaptiveSpeculativeParams`` in
``python/sglang/srt/speculative/adaptive_spec_params.py`` (sgl-project/sglang commit
13d3f642a06f4f41e2927772b8d81548803c85c3, from PR #21599):

* tiers ``candidate_steps`` (default ``[1, 3, 7]``) of ``speculative_num_steps`` (draft tokens per
  round; EAGLE top-k 1, so ``num_draft_tokens = steps + 1``);
* after each verify batch, ``batch_avg`` = mean over the batch's requests of the *accepted draft
  tokens* (the bonus token not counted), ``ema = (1 - ema_alpha) * ema + ema_alpha * batch_avg``
  (``ema_alpha`` 0.2); the EMA starts at ``current_steps - 1``;
* the first ``warmup_batches`` (10) batches only update the EMA; afterwards the tier is recomputed
  every ``update_interval`` (5) batches, i.e. on batch 15, 20, ...;
* recompute: walk down while ``ema <= prev_step - 0.5 + down_hysteresis`` (-0.25), then up while
  ``ema > step - 0.5 + up_hysteresis`` (0.0) — "target ≈ clamp(round(ema) + 1, min, max)", one
  step beyond the observed acceptance. With ``[1, 3, 7]``: 3 -> 7 when ema > 2.5, 7 -> 3 when
  ema <= 2.25, 3 -> 1 when ema <= 0.25, 1 -> 3 when ema > 0.5;
* the initial ``--speculative-num-steps`` is snapped to the nearest candidate (the document's
  rule; the code at 13d3f642 instead adds it to the candidates).

Later SGLang versions route per batch-size slot with per-slot candidates that may include 0
(``DEFAULT_ADAPTIVE_CONFIG``) and a ``ceiling_coeff``; this controller follows the document (one
slot for all batch sizes, no 0 tier).

Adapted to diffusion drafting: tier ``s`` drafts a block of ``s + 1`` in one masked forward
(:mod:`.peer_common`), clipped to ``max_block`` (the accept length then cannot exceed
``max_block - 1``). A "verify batch" is the set of verify rounds observed between two ``plan``
calls; the accept length of a round is its ``accepted`` (draft tokens, bonus excluded), as in
SGLang. AR rounds are ignored. Assumed: ties in the nearest-candidate snap go to the smaller tier;
``initial_steps`` defaults to 3 (the document's example launch uses ``--speculative-num-steps 3``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..request import Round
from .base import StepContext
from .peer_common import BatchDraftLengthPolicy, block_for_draft_len


@dataclass
class SglangAdaptiveConfig:
    """Keys of SGLang's ``--speculative-adaptive-config`` JSON (documented defaults)."""

    candidate_steps: list[int] = field(default_factory=lambda: [1, 3, 7])
    """Discrete ``speculative_num_steps`` tiers (draft tokens per round) that adaptive mode switches between."""
    ema_alpha: float = 0.2
    """EMA smoothing factor for the batch-average accepted draft length."""
    update_interval: int = 5
    """Recompute interval, in verify batches, after warm-up."""
    warmup_batches: int = 10
    """Verify batches observed (EMA updated) before the first switch."""
    down_hysteresis: float = -0.25
    """Extra margin before moving to a smaller step (added to ``prev_step - 0.5``)."""
    up_hysteresis: float = 0.0
    """Extra margin before moving to a larger step (added to ``step - 0.5``)."""
    initial_steps: int = 3
    """``--speculative-num-steps`` at start-up, snapped to the nearest candidate."""


class SglangAdaptivePolicy(BatchDraftLengthPolicy):
    name = "sglang-adaptive"
    def __init__(self, config: SglangAdaptiveConfig, max_block: int):
        candidates = sorted(set(config.candidate_steps))
        if not candidates or any(s < 1 for s in candidates):
            raise ValueError(f"candidate_steps must be positive integers, got {config.candidate_steps}")
        if not 0.0 < config.ema_alpha <= 1.0:
            raise ValueError(f"ema_alpha must be in (0, 1], got {config.ema_alpha}")
        if config.update_interval < 1 or config.warmup_batches < 0:
            raise ValueError("update_interval must be >= 1 and warmup_batches >= 0")
        super().__init__(max_block)
        self.config = config
        self.candidate_steps = candidates
        self.current_steps = min(candidates, key=lambda s: (abs(s - config.initial_steps), s))
        self.ema_accept_len = float(self.current_steps - 1)
        self.batch_count = 0
        self.switches = 0

    def update(self, accepted_per_req: list[int]) -> bool:
        """One verify batch's accepted draft lengths; True if the tier changed (SGLang's ``update``)."""
        if not accepted_per_req:
            return False
        batch_avg = sum(accepted_per_req) / len(accepted_per_req)
        a = self.config.ema_alpha
        self.ema_accept_len = (1 - a) * self.ema_accept_len + a * batch_avg
        self.batch_count += 1
        if self.batch_count <= self.config.warmup_batches:
            return False
        if (self.batch_count - self.config.warmup_batches) % self.config.update_interval != 0:
            return False
        return self._recompute()

    def _recompute(self) -> bool:
        steps, ema = self.candidate_steps, self.ema_accept_len
        idx = steps.index(self.current_steps)
        while idx > 0 and ema <= steps[idx - 1] - 0.5 + self.config.down_hysteresis:
            idx -= 1
        while idx < len(steps) - 1 and ema > steps[idx] - 0.5 + self.config.up_hysteresis:
            idx += 1
        changed = steps[idx] != self.current_steps
        if changed:
            self.current_steps = steps[idx]
            self.switches += 1
        return changed

    def draft_length(self, rounds: list[Round], ctx: StepContext) -> int:
        if rounds:
            self.update([r.accepted for r in rounds])
        return self.current_steps

    def stats(self) -> dict:
        return {"steps": self.current_steps, "block": block_for_draft_len(self.current_steps, self.max_block),
                "ema_accept_len": self.ema_accept_len, "batches": self.batch_count,
                "warm": self.batch_count > self.config.warmup_batches, "switches": self.switches,
                "candidate_steps": list(self.candidate_steps),
                **self.block_counts()}
