"""vLLM Adaptive K: goodput-maximising K on hand-computed cost tables and acceptance profiles."""

from __future__ import annotations

import numpy as np
import pytest

from recguide_trt.runtime.cost_model import CostTable
from recguide_trt.runtime.policies.vllm_adaptive_k import VllmAdaptiveKConfig, VllmAdaptiveKPolicy

from .util import batch_block, verify_batch


def table() -> CostTable:
    """Grid points are hit exactly (blocks 1-4, batches 1 and 8): seconds per forward."""
    return CostTable([1, 8], [1, 2, 3, 4],
                     seconds=[[1.0, 1.2, 1.3, 1.4], [2.0, 4.0, 6.0, 8.0]],    # draft rows in the step
                     plain=[[1.0, 1.1, 1.2, 1.3], [2.0, 3.5, 5.0, 6.5]])      # verify / AR rows only


def policy(alphas, max_block=4, **kw) -> VllmAdaptiveKPolicy:
    p = VllmAdaptiveKPolicy(VllmAdaptiveKConfig(**kw), max_block)
    p.alphas[:] = alphas
    return p


def test_expected_accepted_is_one_plus_sum_of_products_of_conditional_rates():
    p = policy([0.9, 0.5, 0.2])
    assert [p.expected_accepted(k) for k in range(4)] == pytest.approx([1.0, 1.9, 2.35, 2.44])


def test_documented_formula_without_a_cost_table():
    # ITL(K, BS) = 1 + K * 0.1144 + 0.002 * BS; alphas 0.8, 0.7, 0.5, 0.4, ... at BS = 1:
    # goodput 1.8/1.1164 = 1.612, 2.36/1.2308 = 1.917, 2.64/1.3452 = 1.963, 2.752/1.4596 = 1.885 -> K = 3.
    p = policy([0.8, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1], max_block=8)
    assert p.cost is None and p.needs_cost
    assert p.itl(3, 1) == pytest.approx(1.3452)
    assert p.goodput(3, 1) == pytest.approx(2.64 / 1.3452)
    assert p.best_k(1) == 3
    # The batch-size penalty: at BS = 1000 the overhead is 2.0 forwards, best goodput 2.64 / 3.3452 < 1.
    assert p.best_k(1000) == 0
    assert policy([1.0] * 7, max_block=8).best_k(1) == 7               # perfect acceptance: the largest K
    assert policy([0.01] * 7, max_block=8).best_k(1) == 0              # 1.01 / 1.1164 < 1
    assert policy([0.2] * 3, c_draft=0.3).best_k(1) == 0               # 1.2 / 1.302 < 1


def test_cost_table_prices_a_round_as_draft_plus_verify_over_an_ar_step():
    p = policy([0.9, 0.9, 0.9])
    p.cost = table()
    # B = 1: rounds cost 1.2+1.1 = 2.3, 1.3+1.2 = 2.5, 1.4+1.3 = 2.7 AR steps; E = 1.9, 2.71, 3.439.
    assert [p.itl(k, 1) for k in (1, 2, 3)] == pytest.approx([2.3, 2.5, 2.7])
    assert [p.goodput(k, 1) for k in (1, 2, 3)] == pytest.approx([1.9 / 2.3, 2.71 / 2.5, 3.439 / 2.7])
    assert p.best_k(1) == 3
    # B = 8: rounds cost (4+3.5)/2 = 3.75, (6+5)/2 = 5.5, (8+6.5)/2 = 7.25 AR steps: nothing reaches 1.
    assert [p.itl(k, 8) for k in (1, 2, 3)] == pytest.approx([3.75, 5.5, 7.25])
    assert p.best_k(8) == 0
    # A sharp drop after position 2: goodput 1.95/2.3 = 0.848, 2.805/2.5 = 1.122, 2.8905/2.7 = 1.071 -> K = 2.
    p.alphas[:] = [0.95, 0.9, 0.1]
    assert p.best_k(1) == 2
    assert policy([0.95, 0.9, 0.1], min_tokens=1).best_k(1) == 2
    q = policy([0.5, 0.5, 0.5], min_tokens=1)
    q.cost = table()
    assert q.best_k(8) == 1                                           # min_tokens >= 1 never turns it off


def test_plan_applies_the_choice_with_cooldown():
    p = policy([0.9, 0.9, 0.9], cooldown_steps=2)
    p.cost = table()
    assert p.k == 3                                    # starts at num_speculative_tokens
    assert batch_block(p, 8) == 1                      # K = 0 at B = 8: AR
    assert p.k == 0 and p.cooldown == 2
    assert batch_block(p, 1) == 1                      # K = 3 would pay, but the cooldown holds K
    assert batch_block(p, 1) == 1
    assert batch_block(p, 1) == 4                      # cooldown over: K = 3, block 4
    assert p.stats()["changes"] == 2 and p.stats()["chosen_blocks"] == {1: 3, 4: 1}


def test_hysteresis_ignores_a_change_of_one():
    p = policy([0.95, 0.9, 0.1], cooldown_steps=0)
    p.cost = table()
    assert p.best_k(1) == 2
    assert batch_block(p, 1) == 4                      # |2 - 3| = 1 is not > 1: K stays 3
    q = policy([0.95, 0.9, 0.1], cooldown_steps=0, hysteresis=0)
    q.cost = table()
    assert batch_block(q, 1) == 3


def test_per_position_conditional_ema_over_a_window():
    p = VllmAdaptiveKPolicy(VllmAdaptiveKConfig(ema_window_steps=2, ema_alpha=0.5), max_block=4)
    assert list(p.alphas) == [0.85] * 3                # the prior for untracked positions
    verify_batch(p, [(4, 3), (4, 1)])                  # step 1: accepted at 1, 2, 3 / 1, rejected at 2
    assert list(p.alphas) == [0.85] * 3                # the window is not full yet
    verify_batch(p, [(4, 0), (1, 0)])                  # step 2: rejected at 1 (the AR round is ignored)
    # Window: position 1 2/3, position 2 1/2, position 3 1/1 -> halfway from 0.85.
    assert p.alphas == pytest.approx([0.5 * 0.85 + 0.5 * 2 / 3, 0.5 * 0.85 + 0.5 * 0.5, 0.5 * 0.85 + 0.5])
    assert int(p.tracked.sum()) == 3
    verify_batch(p, [(2, 0)])                          # a K = 1 round says nothing about positions 2, 3
    verify_batch(p, [(2, 0)])
    assert p.alphas[0] == pytest.approx(0.5 * (0.5 * 0.85 + 0.5 * 2 / 3))
    assert p.alphas[1:] == pytest.approx([0.5 * 0.85 + 0.5 * 0.5, 0.5 * 0.85 + 0.5])


def test_exploration_drafts_at_the_largest_k():
    p = policy([0.01] * 3, explore_prob=1.0, cooldown_steps=0)
    assert batch_block(p, 1) == 4 and p.k == 0 and p.explored == 1


def test_num_speculative_tokens_is_capped_at_the_largest_block():
    p = VllmAdaptiveKPolicy(VllmAdaptiveKConfig(num_speculative_tokens=40), max_block=16)
    assert p.max_k == 15 and p.alphas.shape == (15,)
    assert np.all(p.alphas == 0.85)
