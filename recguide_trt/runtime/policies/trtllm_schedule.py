"""TensorRT-LLM's batch-size draft-length schedule with the acceptance-rate gate (a peer, issue #18).

Followed:

* ``draft_len_schedule`` (NVIDIA/TensorRT-LLM PR #8194 stage 1, PR #10860 one-model path, PR #12262
  all algorithms): ``get_draft_len_for_batch_size`` in ``tensorrt_llm/_torch/speculative/utils.py``
  (stored commit 011d0933dcb5e592f5fa2626beaf42a96324c578). Keys are batch sizes, values the draft
  length used for batch sizes *up to* that key: ``bisect_left`` finds the first key >= the batch
  size; above the last key the draft length is 0 (speculation off, "implicit max concurrency
  control"). ``{4: 4, 8: 2, 32: 1}``: batch 1-4 -> 4, 5-8 -> 2, 9-32 -> 1, 33+ -> 0. No schedule:
  the static ``max_draft_len``. The draft length is chosen at the start of each iteration from the
  live batch size, and speculation turns back on when the batch shrinks. (PR #8194's first version
  used the largest key <= batch size; PR #10860 changed it to the semantics above.) The config
  validator rejects keys < 1 and values < 0, sorts the keys, and requires the smallest key's value
  to equal ``max_draft_len``. The newest code adds a ``min_draft_len`` floor (0 by default), not
  modelled here.
* the acceptance-rate gate (PR #12905, which replaced PR #7283's acceptance-*length* gate):
  ``SpeculationGate.record_acceptance_rate`` in ``tensorrt_llm/_torch/speculative/speculation_gate.py``.
  Each speculation-enabled iteration records one batch-level sample ``sum(accepted draft tokens) /
  sum(draft tokens)`` over the requests that drafted (``PyExecutor._update_batch_acceptance_rate``);
  a rolling window keeps the last ``acceptance_rate_window_size`` samples; once at least that many
  have been recorded, a window mean below ``acceptance_rate_threshold`` disables speculation
  *permanently* (a one-way latch). The gate exists only when both knobs are set (both default to
  None); the threshold must lie in [0, 1].

Adapted to diffusion drafting: draft length ``k`` is a block of ``k + 1`` drafted in one masked
forward (:mod:`.peer_common`), clipped to the engine's ``max_block``. The "batch size" is the live
concurrency (``StepContext.concurrency``). An iteration's sample is made of the verify rounds
observed between two ``plan`` calls; acceptance rate = accepted / drafted, where a round of block
``L`` drafted ``L - 1`` tokens. AR rounds are ignored.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

from ..request import Round
from .base import StepContext
from .peer_common import BatchDraftLengthPolicy


@dataclass
class TrtllmScheduleConfig:
    """Knobs of TensorRT-LLM's dynamic draft length (``speculative_config`` in its LLM API)."""

    draft_len_schedule: dict[int, int] | None = None
    """Batch size -> draft length for batch sizes up to that key (first key >= batch size; 0 above
    the last key). None: always ``max_draft_len``. Example ``{4: 4, 8: 2, 32: 1}``."""
    max_draft_len: int | None = None
    """Static draft length (TensorRT-LLM requires it; the smallest schedule key must map to it).
    None: the smallest key's value with a schedule, else ``max_block - 1``."""
    acceptance_rate_window_size: int | None = None
    """Iterations in the gate's rolling window (TensorRT-LLM default None: no gate)."""
    acceptance_rate_threshold: float | None = None
    """Window-mean acceptance rate (accepted / drafted, in [0, 1]) below which speculation is
    turned off for good (TensorRT-LLM default None: no gate)."""


def schedule_draft_len(schedule: dict[int, int] | None, batch_size: int, max_draft_len: int) -> int:
    """TensorRT-LLM's ``get_draft_len_for_batch_size`` (without the newest ``min_draft_len`` floor)."""
    if schedule is None:
        return max_draft_len
    keys = sorted(schedule)
    idx = bisect.bisect_left(keys, batch_size)
    if idx < len(keys):
        return schedule[keys[idx]]
    return 0


class SpeculationGate:
    """TensorRT-LLM's rolling acceptance-rate gate: a permanent one-way disable."""

    def __init__(self, window: int, threshold: float):
        self.window = window
        self.threshold = threshold
        self.history: deque[float] = deque()
        self.total = 0.0
        self.recorded = 0
        self.disabled = False

    def record(self, acceptance_rate: float) -> bool:
        """Record one iteration's acceptance rate; True when this call disables speculation."""
        if self.disabled:
            return False
        if not 0.0 <= acceptance_rate <= 1.0:
            raise ValueError(f"acceptance_rate must be in [0, 1], got {acceptance_rate}")
        self.history.append(acceptance_rate)
        self.total += acceptance_rate
        if len(self.history) > self.window:
            self.total -= self.history.popleft()
        self.recorded += 1
        if self.recorded >= self.window and self.total / len(self.history) < self.threshold:
            self.disabled = True
            return True
        return False

    @property
    def average(self) -> float | None:
        return self.total / len(self.history) if self.history else None


class TrtllmSchedulePolicy(BatchDraftLengthPolicy):
    name = "trtllm-schedule"
    def __init__(self, config: TrtllmScheduleConfig, max_block: int):
        schedule = config.draft_len_schedule
        if schedule is not None:
            if not schedule:
                raise ValueError("draft_len_schedule must not be empty (use None for no schedule)")
            for bs, k in schedule.items():
                if bs < 1:
                    raise ValueError(f"draft_len_schedule: batch size threshold must be >= 1, got {bs}")
                if k < 0:
                    raise ValueError(f"draft_len_schedule: draft length must be >= 0, got {k}")
            schedule = dict(sorted(schedule.items()))
            smallest = next(iter(schedule))
            if config.max_draft_len is not None and schedule[smallest] != config.max_draft_len:
                raise ValueError(f"draft_len_schedule[{smallest}] must equal max_draft_len "
                                 f"({config.max_draft_len}), got {schedule[smallest]}")
        super().__init__(max_block)
        self.config = config
        self.schedule = schedule
        if config.max_draft_len is not None:
            self.max_draft_len = config.max_draft_len
        elif schedule is not None:
            self.max_draft_len = schedule[next(iter(schedule))]
        else:
            self.max_draft_len = max_block - 1
        self.gate: SpeculationGate | None = None
        window, threshold = config.acceptance_rate_window_size, config.acceptance_rate_threshold
        if threshold is not None and not 0.0 <= threshold <= 1.0:
            raise ValueError(f"acceptance_rate_threshold must be in [0, 1], got {threshold}")
        if window is not None and window < 0:
            raise ValueError(f"acceptance_rate_window_size must be >= 0, got {window}")
        if window and threshold is not None:
            self.gate = SpeculationGate(window, threshold)
        self.draft_len = self.max_draft_len

    def draft_len_for(self, batch_size: int) -> int:
        """The iteration's draft length: the schedule's, or 0 once the gate has tripped."""
        if self.gate is not None and self.gate.disabled:
            return 0
        return schedule_draft_len(self.schedule, batch_size, self.max_draft_len)

    def _record_iteration(self, rounds: list[Round]) -> None:
        drafted = sum(r.block - 1 for r in rounds)
        if self.gate is None or drafted <= 0:
            return
        self.gate.record(sum(r.accepted for r in rounds) / drafted)

    def draft_length(self, rounds: list[Round], ctx: StepContext) -> int:
        self._record_iteration(rounds)
        self.draft_len = self.draft_len_for(ctx.concurrency)
        return self.draft_len

    def stats(self) -> dict:
        gate = self.gate
        return {"draft_len": self.draft_len, "schedule": self.schedule, "max_draft_len": self.max_draft_len,
                "gate": None if gate is None else {"disabled": gate.disabled, "average": gate.average,
                                                   "recorded": gate.recorded, "window": gate.window,
                                                   "threshold": gate.threshold},
                **self.block_counts()}
