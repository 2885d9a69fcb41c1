"""SGLang --auto-spec: closest bucket, per-bucket EMA thresholds and step ranges by hand."""

from __future__ import annotations

import pytest

from recguide_trt.runtime.policies.sglang_autospec import SglangAutospecConfig, SglangAutospecPolicy

from .util import batch_block, verify_batch


def test_closest_bucket_ties_to_the_smaller():
    p = SglangAutospecPolicy(SglangAutospecConfig(), max_block=16)
    got = {bs: p.bucket(bs) for bs in (0, 1, 2, 3, 5, 6, 7, 12, 13, 24, 25, 96, 97, 200)}
    assert got == {0: 1, 1: 1, 2: 2, 3: 2, 5: 4, 6: 4, 7: 8, 12: 8, 13: 16, 24: 16, 25: 32, 96: 64, 97: 128,
                   200: 128}


def test_documented_initial_steps_and_thresholds():
    p = SglangAutospecPolicy(SglangAutospecConfig(), max_block=16)
    assert p.steps == {1: 5, 2: 5, 4: 5, 8: 4, 16: 3, 32: 3, 64: 3, 128: 1}
    assert (p.increase[16], p.decrease[16]) == (0.95, 0.60)
    assert (p.increase[32], p.decrease[32]) == (0.91, 0.66)
    assert [batch_block(p, c) for c in (1, 8, 20, 128)] == [6, 5, 4, 2]   # block = num_steps + 1
    assert set(p.ema.values()) == {0.5}


def test_per_bucket_ema_moves_one_step_at_a_time():
    p = SglangAutospecPolicy(SglangAutospecConfig(), max_block=16)
    batch_block(p, 1)
    verify_batch(p, [(6, 5)], concurrency=1)       # accept length 6 of 6 tokens: rate 1.0
    assert p.ema[1] == pytest.approx(0.3 * 1.0 + 0.7 * 0.5)          # 0.65 >= 0.55
    assert p.steps[1] == 6 and batch_block(p, 1) == 7
    assert p.ema[8] == 0.5 and p.steps[8] == 4                       # other buckets untouched
    verify_batch(p, [(7, 6)], concurrency=1)       # 0.755: already at the top of [3, 4, 5, 6]
    assert p.ema[1] == pytest.approx(0.755) and p.steps[1] == 6
    verify_batch(p, [(7, 0)], concurrency=1)       # rate 1/7: ema 0.5714 still >= 0.55, no higher step
    assert p.ema[1] == pytest.approx(0.3 / 7 + 0.7 * 0.755) and p.steps[1] == 6
    verify_batch(p, [(7, 0)], concurrency=1)       # ema 0.4428 < 0.50: one step down
    assert p.ema[1] == pytest.approx(0.3 / 7 + 0.7 * (0.3 / 7 + 0.7 * 0.755))
    assert p.steps[1] == 5


def test_rate_counts_the_bonus_token_over_the_batch():
    p = SglangAutospecPolicy(SglangAutospecConfig(), max_block=16)
    batch_block(p, 3)                              # bucket 2
    verify_batch(p, [(6, 5), (6, 1), (6, 2)], concurrency=3)   # accept lengths 6, 2, 3 of 6: rate 11/18
    assert p.ema[2] == pytest.approx(0.3 * 11 / 18 + 0.7 * 0.5)   # 0.5333: inside (0.50, 0.55)
    assert p.steps[2] == 5


def test_step_range_bounds_each_bucket():
    p = SglangAutospecPolicy(SglangAutospecConfig(), max_block=16)
    batch_block(p, 128)
    for _ in range(3):
        verify_batch(p, [(2, 0)] * 128, concurrency=128)   # rate 0.5 < 0.65, but 1 is the bottom
    assert p.steps[128] == 1 and batch_block(p, 128) == 2
    for _ in range(20):
        verify_batch(p, [(5, 4)] * 128, concurrency=128)   # rate 1.0: up to the top of [1, 2, 3, 4]
    assert p.steps[128] == 4 and batch_block(p, 128) == 5


def test_update_goes_to_the_bucket_of_the_step_that_verified():
    p = SglangAutospecPolicy(SglangAutospecConfig(), max_block=16)
    batch_block(p, 8)                              # the verified step ran at concurrency 8
    verify_batch(p, [(5, 4)] * 8, concurrency=1)
    assert p.ema[8] == pytest.approx(0.65) and p.ema[1] == 0.5


def test_threshold_overrides_and_custom_ranges():
    cfg = SglangAutospecConfig(bs_steps_mapping={1: [2, 5, 7], 16: [1, 3], 20: [2, 4]}, pos_threshold=[0.7],
                               neg_threshold=[0.4, 0.9])
    p = SglangAutospecPolicy(cfg, max_block=16)
    assert p.bs_list == [1, 16, 20]
    assert (p.increase[1], p.decrease[1]) == (0.7, 0.4)          # overrides, one per bucket ascending
    assert (p.increase[16], p.decrease[16]) == (0.95, 0.9)
    assert (p.increase[20], p.decrease[20]) == (0.95, 0.60)      # default of the largest default bucket <= 20
    assert p.steps == {1: 5, 16: 3, 20: 2}                       # unlisted bucket: initial 3, tie -> the first (2)
    batch_block(p, 1)
    verify_batch(p, [(6, 5)], concurrency=1)                     # ema 0.65: >= 0.55 but < 0.7
    assert p.steps[1] == 5
    verify_batch(p, [(6, 0)], concurrency=1)                     # ema 0.505: >= 0.4
    assert p.steps[1] == 5
    verify_batch(p, [(6, 0)], concurrency=1)                     # ema 0.4035: >= 0.4
    verify_batch(p, [(6, 0)], concurrency=1)                     # ema 0.3325 < 0.4: down
    assert p.steps[1] == 2
