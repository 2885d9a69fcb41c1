"""TensorRT-LLM draft_len_schedule + acceptance-rate gate: documented behaviour on hand-made cases."""

from __future__ import annotations

import pytest

from recguide_trt.runtime.plan import Kind, Work
from recguide_trt.runtime.policies.base import StepContext
from recguide_trt.runtime.policies.trtllm_schedule import (
    TrtllmScheduleConfig,
    TrtllmSchedulePolicy,
    schedule_draft_len,
)
from recguide_trt.runtime.request import Round

from .util import batch_block, request, verify_batch

SCHEDULE = {4: 4, 8: 2, 32: 1}


def test_schedule_lookup_is_the_first_key_at_or_above_the_batch_size():
    got = {bs: schedule_draft_len(SCHEDULE, bs, 4) for bs in (1, 2, 4, 5, 8, 9, 31, 32, 33, 500)}
    assert got == {1: 4, 2: 4, 4: 4, 5: 2, 8: 2, 9: 1, 31: 1, 32: 1, 33: 0, 500: 0}
    assert schedule_draft_len(None, 1000, 6) == 6          # no schedule: the static max_draft_len
    assert schedule_draft_len({32: 1, 4: 4, 8: 2}, 6, 4) == 2   # key order does not matter


def test_policy_maps_draft_length_to_block_and_turns_back_on():
    p = TrtllmSchedulePolicy(TrtllmScheduleConfig(draft_len_schedule=SCHEDULE), max_block=16)
    assert p.max_draft_len == 4                     # the smallest key's value
    assert [batch_block(p, c) for c in (1, 4, 5, 8, 9, 32, 33, 64, 3)] == [5, 5, 3, 3, 2, 2, 1, 1, 5]
    assert p.stats()["chosen_blocks"] == {5: 3, 3: 2, 2: 2, 1: 2}


def test_draft_length_above_max_block_is_clipped():
    p = TrtllmSchedulePolicy(TrtllmScheduleConfig(draft_len_schedule={1: 31, 8: 3}), max_block=16)
    assert batch_block(p, 1) == 16
    assert batch_block(p, 8) == 4
    assert batch_block(TrtllmSchedulePolicy(TrtllmScheduleConfig(), max_block=8), 1000) == 8  # static: max_block - 1


def test_plan_verifies_pending_drafts_and_caps_blocks_per_request():
    p = TrtllmSchedulePolicy(TrtllmScheduleConfig(draft_len_schedule=SCHEDULE), max_block=16)
    reqs = [request(0, block=7), request(1), request(2, remaining=3), request(3, remaining=1),
            request(4, block_size=2)]
    works = p.plan(reqs, StepContext(4, 0))
    assert works == [Work(0, Kind.VERIFY, 7), Work(1, Kind.DRAFT, 5), Work(2, Kind.DRAFT, 3), Work(3, Kind.AR),
                     Work(4, Kind.DRAFT, 2)]
    # Above the last key nobody drafts, but a pending draft is still verified.
    assert p.plan([request(0, block=5), request(1)], StepContext(40, 1)) == [Work(0, Kind.VERIFY, 5),
                                                                             Work(1, Kind.AR)]


def test_schedule_validation():
    with pytest.raises(ValueError, match="must equal max_draft_len"):
        TrtllmSchedulePolicy(TrtllmScheduleConfig(draft_len_schedule=SCHEDULE, max_draft_len=3), 16)
    with pytest.raises(ValueError, match=">= 1"):
        TrtllmSchedulePolicy(TrtllmScheduleConfig(draft_len_schedule={0: 4}), 16)
    with pytest.raises(ValueError, match=">= 0"):
        TrtllmSchedulePolicy(TrtllmScheduleConfig(draft_len_schedule={1: -1}), 16)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        TrtllmSchedulePolicy(TrtllmScheduleConfig(acceptance_rate_window_size=4, acceptance_rate_threshold=1.5), 16)


def test_gate_needs_both_knobs():
    assert TrtllmSchedulePolicy(TrtllmScheduleConfig(acceptance_rate_window_size=4), 16).gate is None
    assert TrtllmSchedulePolicy(TrtllmScheduleConfig(acceptance_rate_threshold=0.5), 16).gate is None
    assert TrtllmSchedulePolicy(TrtllmScheduleConfig(acceptance_rate_window_size=0,
                                                     acceptance_rate_threshold=0.5), 16).gate is None


def test_gate_waits_for_a_full_window_then_turns_speculation_off_for_good():
    cfg = TrtllmScheduleConfig(max_draft_len=3, acceptance_rate_window_size=3, acceptance_rate_threshold=0.5)
    p = TrtllmSchedulePolicy(cfg, max_block=16)
    verify_batch(p, [(4, 0), (4, 1)])        # 1/6 of the drafted tokens accepted
    verify_batch(p, [(4, 3), (4, 3)])        # 6/6
    verify_batch(p, [(1, 0), (1, 0)])        # AR rounds: no sample
    assert p.gate.recorded == 2 and not p.gate.disabled   # mean 0.583, and the window is not full anyway
    assert batch_block(p, 1) == 4
    verify_batch(p, [(4, 0)])                # 0/3: mean (1/6 + 1 + 0) / 3 = 0.389 < 0.5
    assert p.gate.disabled
    assert p.gate.average == pytest.approx((1 / 6 + 1 + 0) / 3)
    for _ in range(5):                       # perfect rounds afterwards change nothing
        verify_batch(p, [(4, 3)] * 4)
    assert p.gate.disabled and p.gate.recorded == 3
    assert [batch_block(p, c) for c in (1, 2, 100)] == [1, 1, 1]
    assert p.stats()["gate"]["disabled"] is True and p.stats()["draft_len"] == 0


def test_gate_window_rolls():
    cfg = TrtllmScheduleConfig(max_draft_len=4, acceptance_rate_window_size=2, acceptance_rate_threshold=0.5)
    p = TrtllmSchedulePolicy(cfg, max_block=16)
    for accepted in (4, 0):                  # samples 1.0, 0.0: mean 0.5 is not below 0.5
        p.observe(request(), Round(5, accepted), None)
        p.plan([], StepContext(1, 0))
    assert not p.gate.disabled
    verify_batch(p, [(5, 4), (5, 1)])        # 5/8: window (0.0, 0.625), mean 0.3125
    assert p.gate.disabled
    assert p.gate.average == pytest.approx(0.3125)
