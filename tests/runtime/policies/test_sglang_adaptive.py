"""SGLang --speculative-adaptive: EMA tiers, warm-up, update interval and hysteresis by hand."""

from __future__ import annotations

import pytest

from recguide_trt.runtime.policies.base import StepContext
from recguide_trt.runtime.policies.sglang_adaptive import SglangAdaptiveConfig, SglangAdaptivePolicy
from recguide_trt.runtime.request import Round

from .util import batch_block, request, verify_batch


def test_defaults_start_on_tier_three():
    p = SglangAdaptivePolicy(SglangAdaptiveConfig(), max_block=16)
    assert p.candidate_steps == [1, 3, 7]
    assert p.current_steps == 3 and p.ema_accept_len == 2.0
    assert batch_block(p, 1) == 4 and batch_block(p, 64) == 4   # one tier for every batch size


def test_initial_steps_snap_to_the_nearest_candidate():
    tiers = {s: SglangAdaptivePolicy(SglangAdaptiveConfig(initial_steps=s), 16).current_steps for s in (1, 2, 5, 6, 9)}
    assert tiers == {1: 1, 2: 1, 5: 3, 6: 7, 9: 7}   # 2 and 5 are ties: the smaller tier


def test_ema_of_the_batch_average_accepted_draft_length():
    p = SglangAdaptivePolicy(SglangAdaptiveConfig(), max_block=16)
    verify_batch(p, [(4, 3), (4, 1), (4, 2)])          # batch average 2 accepted drafts (bonus excluded)
    assert p.ema_accept_len == pytest.approx(2.0)
    verify_batch(p, [(4, 0), (4, 0)])
    assert p.ema_accept_len == pytest.approx(0.8 * 2.0)
    p.observe(request(), Round(1, 0), None)            # an AR round is not a verify batch
    p.plan([], StepContext(1, 0))
    assert p.batch_count == 2


def test_warmup_and_update_interval():
    p = SglangAdaptivePolicy(SglangAdaptiveConfig(), max_block=16)
    for n in range(1, 15):
        verify_batch(p, [(4, 3)] * 2)                   # every draft accepted
        assert p.current_steps == 3, n                 # ema = 3 - 0.8**n passes 2.5 at n = 4, but no switch yet
    assert p.ema_accept_len == pytest.approx(3 - 0.8 ** 14)
    verify_batch(p, [(4, 3)] * 2)                       # batch 15 = warm-up 10 + interval 5
    assert p.current_steps == 7 and batch_block(p, 1) == 8
    assert p.stats()["switches"] == 1


def _raw(initial: int = 3) -> SglangAdaptivePolicy:
    """No warm-up, a recompute every batch, the EMA equal to the last batch average."""
    return SglangAdaptivePolicy(SglangAdaptiveConfig(ema_alpha=1.0, warmup_batches=0, update_interval=1,
                                                     initial_steps=initial), max_block=16)


def test_hysteresis_band_between_tiers_three_and_seven():
    p = _raw()
    verify_batch(p, [(4, 3), (4, 2)])      # 2.5: not above 3 - 0.5
    assert p.current_steps == 3
    verify_batch(p, [(4, 3), (4, 3), (4, 2), (4, 2), (4, 3)])   # 2.6 > 2.5: up
    assert p.current_steps == 7
    verify_batch(p, [(8, 2), (8, 3), (8, 2), (8, 3), (8, 2)])   # 2.4 would not have raised 3, nor drops 7
    assert p.current_steps == 7
    verify_batch(p, [(8, 2), (8, 2), (8, 2), (8, 3)])           # 2.25 <= 3 - 0.5 - 0.25: down
    assert p.current_steps == 3


def test_hysteresis_around_tier_one_and_multi_tier_jumps():
    p = _raw()
    verify_batch(p, [(4, 1), (4, 0), (4, 0), (4, 0)])   # 0.25 <= 1 - 0.5 - 0.25: down to 1
    assert p.current_steps == 1
    verify_batch(p, [(2, 1), (2, 0)])                    # 0.5: not above 1 - 0.5
    assert p.current_steps == 1
    verify_batch(p, [(2, 1)] * 3 + [(2, 0)] * 2)         # 0.6 > 0.5: up to 3 (2.5 needed for 7)
    assert p.current_steps == 3
    p = _raw(initial=1)
    verify_batch(p, [(8, 5)])                            # far above: 1 -> 3 -> 7 in one recompute
    assert p.current_steps == 7
    verify_batch(p, [(8, 0)])                            # far below: 7 -> 3 -> 1
    assert p.current_steps == 1
    p = _raw()
    verify_batch(p, [(4, 1)] * 3 + [(4, 0)])             # 0.75: stays 3 (neither 0.25 nor 2.5 crossed)
    assert p.current_steps == 3


def test_tier_block_is_clipped_to_max_block():
    p = SglangAdaptivePolicy(SglangAdaptiveConfig(initial_steps=7), max_block=4)
    assert batch_block(p, 1) == 4
    assert p.stats()["block"] == 4 and p.stats()["steps"] == 7
