"""Policies see plain data: block-size choice, mode switching, fused rows and the hit rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recguide_trt.backends.base import ForwardOutput
from recguide_trt.backends.torch_backend import TorchBackend
from recguide_trt.model import masks
from recguide_trt.runtime.acceptance_model import AcceptanceModel
from recguide_trt.runtime.cost_model import CostTable
from recguide_trt.runtime.executor import Executor
from recguide_trt.runtime.mismatch import MismatchPrediction
from recguide_trt.runtime.params import SamplingParams
from recguide_trt.runtime.plan import Kind, Prospective, Work
from recguide_trt.runtime.policies.base import StepContext
from recguide_trt.runtime.policies.recguide import ADAPTIVE, OVERLAP, RecGuideConfig, RecGuidePolicy
from recguide_trt.runtime.request import Draft, Request, Round
from tests.conftest import random_model, tiny_config


def linear_cost(per_token: float, fixed: float) -> CostTable:
    batches, tokens = [1, 8, 64], [1, 2, 4, 8, 16, 32]
    return CostTable(batches, tokens, [[fixed + per_token * b * t for t in tokens] for b in batches])


def request(rid=0, history=(), remaining=100, draft=None):
    r = Request(rid, [5, 6, 7], SamplingParams(max_tokens=remaining), np.random.default_rng(0))
    r.seed, r.cache_len = 9, 3
    r.history.extend(history)
    r.draft = draft
    return r


def test_expected_tokens_and_online_update():
    m = AcceptanceModel(max_block=8, prior_accept=0.5, prior_strength=2.0)
    b = m.history_bin([])
    assert m.expected_tokens(b, 1) == 1.0
    assert m.expected_tokens(b, 3) == pytest.approx(1 + 0.5 + 0.25)
    for _ in range(200):
        m.update(b, 8, 7)           # always fully accepted
    assert m.expected_tokens(b, 8) > 7.5
    strong = m.history_bin([Round(8, 7)] * 4)
    weak = m.history_bin([Round(8, 0)] * 4)
    assert strong > weak


def _set_rate(pol, bin_, rate):
    pol.acceptance.success[bin_] = rate * 1000
    pol.acceptance.attempts[bin_] = 1000.0
    pol.acceptance.refresh()


def test_chooser_picks_the_expected_argmax():
    pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 2, 4, 8)), 8, 3, linear_cost(1.0, 0.5))
    b = pol.acceptance.history_bin([])
    _set_rate(pol, b, 0.9)
    for C in (1, 8, 64):
        for overlap in (False, True):
            brute = {}
            for cap in (1, 2, 4, 8):
                vals = {L: pol.step_value(b, L, overlap) for L in (1, 2, 4, 8) if L <= cap}
                L = max(vals, key=vals.get)
                brute[L] = max(brute.get(L, 0), vals[L] / pol.step_time(C, L, overlap))
            _, blocks = pol.choose_blocks([(b, 8)], C, overlap)
            assert blocks[0] == max(brute, key=brute.get), (C, overlap)
    # Nearly free tokens: the largest block wins. Expensive tokens and poor acceptance: AR wins.
    pol.cost = linear_cost(1e-6, 1.0)
    pol.cost.__post_init__()
    assert pol.choose_blocks([(b, 8)], 64, False)[1] == [8]
    pol.cost = linear_cost(1.0, 0.0)
    _set_rate(pol, b, 0.1)
    assert pol.choose_blocks([(b, 8)], 64, False)[1] == [1]


def test_overlap_step_time_prices_a_miss_draft_at_its_own_width():
    pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 8)), 8, 3, linear_cost(1.0, 0.5))
    h = pol.block_hit_rate(8)
    # C = 1: per round one fused step (16 tokens) and, after a miss, one plain draft step (8 tokens).
    per_round = pol._t(1, 16) + (1 - h) * pol._t(1, 8)
    assert pol.step_time(1, 8, True) * (2 - h) == pytest.approx(per_round)
    # Many requests: some row is almost always fused, so the step costs the fused width.
    assert pol.step_time(64, 8, True) == pytest.approx(pol._t(64, 16), rel=1e-6)
    assert pol.step_time(8, 8, False) == pol._t(8, 8) and pol.step_time(8, 1, True) == pol._t(8, 1)


def test_plain_speculation_pays_the_adapter_only_on_steps_that_draft():
    base = linear_cost(1.0, 0.5)
    plain = [[0.8 * v if t > 1 else v for t, v in zip(base.tokens, row)] for row in base.seconds]
    cost = CostTable(base.batches, base.tokens, base.seconds, plain=plain)
    pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 8)), 8, 3, cost)
    # C = 1: a round is one draft step (adapter) and one verify step (none).
    assert 2 * pol.step_time(1, 8, False) == pytest.approx(pol._t(1, 8, True) + pol._t(1, 8, False))
    assert pol._t(1, 8, False) == pytest.approx(0.8 * pol._t(1, 8, True))
    # Many requests: some row almost always drafts.
    assert pol.step_time(64, 8, False) == pytest.approx(pol._t(64, 8, True), rel=1e-6)
    # Overlap drafts in every step; AR never has a draft token.
    assert pol.step_time(1, 8, True) > pol._t(1, 8, True)
    assert pol.step_time(1, 1, False) == pol._t(1, 1, False) == cost.step_time(1, 1)


def test_chooser_gives_requests_their_own_blocks():
    pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 2, 4, 8)), 8, 3, linear_cost(1e-6, 1.0))
    weak, strong = 0, 4
    _set_rate(pol, weak, 0.05)
    _set_rate(pol, strong, 0.95)
    _, blocks = pol.choose_blocks([(weak, 8), (strong, 8), (strong, 3)], 3, False)
    assert blocks == [1, 8, 3]   # the last request has 3 tokens left: a shorter block, not AR


def test_untried_positions_inherit_the_deepest_learned_rate():
    pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 4, 16)), 16, 3)
    b = pol.acceptance.history_bin([])
    for _ in range(300):
        pol.acceptance.update(b, 4, 3)   # only block 4 ever drafted, always fully accepted
    probs = pol.acceptance.accept_probs(b)
    assert probs[3] > 0.95 and probs[10] > 0.95
    assert pol.acceptance.expected_tokens(b, 16) > pol.acceptance.expected_tokens(b, 4) + 8


def test_mode_switch_derived_from_cost_table_with_hysteresis():
    # Fixed cost per forward plus a per-token cost: spare capacity at low C, compute bound at high C.
    pol = RecGuidePolicy(RecGuideConfig(prior_hit_rate=0.4), 16, 3, linear_cost(0.01, 1.0), max_concurrency=64)
    switch = pol.derived_switch()
    assert 1 <= switch < 64
    steps = iter(range(10**6))

    def run(concurrency: int, n: int) -> str:   # the mode after n steps at this load
        return [pol.choose_mode(concurrency, next(steps)) for _ in range(n)][-1]

    assert run(1, 1) == OVERLAP
    # A steady load one request above the switch point runs the adaptive mode, one at it the overlap.
    assert run(switch + 1, 40) == ADAPTIVE
    assert run(switch, 40) == OVERLAP
    # A closed loop's dip or bump of one request for a step (a request ends, the next arrives) moves
    # neither: the mode follows the load averaged over LOAD_STEPS steps, with a band around switch + 0.5.
    assert run(switch + 1, 40) == ADAPTIVE
    for _ in range(4):
        assert run(switch, 1) == ADAPTIVE and run(switch + 1, 15) == ADAPTIVE
    assert run(switch, 40) == OVERLAP
    for _ in range(4):
        assert run(switch + 1, 1) == OVERLAP and run(switch, 15) == OVERLAP
    assert run(64, 20) == ADAPTIVE and run(1, 40) == OVERLAP
    with pytest.raises(ValueError, match="hysteresis"):
        RecGuidePolicy(RecGuideConfig(hysteresis=0.6), 16, 3)
    assert RecGuidePolicy(RecGuideConfig(switch_concurrency=5), 16, 3).derived_switch() == 5
    # Overlap never pays (switch point 0): adaptive from the first step, even at C = 1.
    assert RecGuidePolicy(RecGuideConfig(switch_concurrency=0), 16, 3).choose_mode(1, 0) == ADAPTIVE


def _switch_through_the_chooser(pol) -> int:
    """The switch point as the chooser itself scores C identical newcomers (the definition): the end of the run of
    loads from C = 1 at which the overlap scores above the adaptive mode."""
    switch = 0
    for c in range(1, pol.max_concurrency + 1):
        keys = [(pol.acceptance.no_history, max(pol.blocks))] * c
        over_score, over_blocks = pol.choose_blocks(keys, c, True)
        if not (max(over_blocks) > 1 and over_score > pol.choose_blocks(keys, c, False)[0]):
            break
        switch = c
    return switch


def test_switch_point_ends_where_the_overlap_first_loses():
    """A table that prices the overlap below the adaptive mode at C = 1 (a fused 8-token row dear) and above it at
    C = 2 (8 tokens a row nearly free there) puts C = 1 in the adaptive mode: the switch point is the end of the run of
    loads from 1 where the overlap wins, here none, not the largest load where it wins."""
    batches, tokens = [1, 2, 4], [1, 2, 4, 8, 16]
    seconds = [[1.0, 1.0, 1.0, 3.0, 6.0],      # C = 1: a fused row (2 x 4 tokens) costs 3 plain steps
               [1.0, 1.0, 1.0, 1.05, 2.0],     # C = 2: 8 tokens a row cost what 1 does
               [1.0, 1.0, 1.0, 1.05, 2.0]]
    pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 4), prior_hit_rate=0.6), 4, 3,
                         CostTable(batches, tokens, seconds), max_concurrency=4)
    keys = lambda c: [(pol.acceptance.no_history, 4)] * c  # noqa: E731
    assert pol.choose_blocks(keys(1), 1, True)[0] < pol.choose_blocks(keys(1), 1, False)[0]
    assert pol.choose_blocks(keys(2), 2, True)[0] > pol.choose_blocks(keys(2), 2, False)[0]
    assert pol.derived_switch() == 0 == _switch_through_the_chooser(pol)
    assert pol.choose_mode(1, 0) == ADAPTIVE


@pytest.mark.parametrize("objective", ["ratio", "penalty"])
def test_derived_switch_matches_the_chooser(objective):
    rng = np.random.default_rng(0)
    switches = set()
    for trial in range(40):
        per_token, fixed = rng.uniform(0.001, 0.05), rng.uniform(0.2, 2.0)
        pol = RecGuidePolicy(RecGuideConfig(objective=objective, prior_hit_rate=rng.uniform(0.0, 0.9)), 16, 3,
                             linear_cost(per_token, fixed), max_concurrency=48)
        for bin_ in range(pol.acceptance.no_history):
            _set_rate(pol, bin_, rng.uniform(0.05, 0.95))
        pol.hits, pol.prospective = int(rng.integers(0, 50)), 50
        switch = pol.derived_switch()
        assert switch == _switch_through_the_chooser(pol), trial
        switches.add(switch)
    assert len(switches) > 3   # the trials cover switch points of every kind, 0 included
    assert 0 in switches


@pytest.mark.parametrize("objective", ["ratio", "penalty"])
def test_all_ar_shortcut_agrees_with_the_chooser(objective):
    """Where the shortcut says "AR for everyone", the chooser says so for every batch; and it fires."""
    rng = np.random.default_rng(1)
    fired = 0
    for trial in range(60):
        cost = linear_cost(rng.uniform(0.001, 0.2), rng.uniform(0.05, 2.0))
        pol = RecGuidePolicy(RecGuideConfig(objective=objective, candidate_blocks=(1, 2, 4, 8)), 8, 3, cost)
        for bin_ in range(pol.acceptance.no_history + 1):
            _set_rate(pol, bin_, rng.uniform(0.05, 0.95))
        C = int(rng.choice([1, 4, 16, 64]))
        n = int(rng.integers(1, C + 1))
        if not pol.all_ar(n, C):
            continue
        fired += 1
        for _ in range(20):
            keys = [(int(rng.integers(0, pol.acceptance.no_history + 1)), int(rng.integers(1, 9))) for _ in range(n)]
            assert pol.choose_blocks(keys, C, False)[1] == [1] * n, (trial, keys)
    assert fired >= 5


def test_all_ar_steps_plan_what_the_chooser_plans():
    pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 4), switch_concurrency=0, warmup_rounds=0), 4, 3,
                         linear_cost(1.0, 0.01))    # every drafted token costs a whole AR step
    _set_rate(pol, pol.acceptance.no_history, 0.5)
    reqs = [request(0), request(1, draft=Draft([11, 12, 13], MismatchPrediction(2, 21))), request(2)]
    assert pol.all_ar(3, 3)
    works = pol.plan(reqs, StepContext(3, 0))
    assert works == [Work(0, Kind.AR), Work(1, Kind.VERIFY, 4), Work(2, Kind.AR)]
    pol.all_ar = lambda n, c: False   # the per-request path
    assert pol.plan(reqs, StepContext(3, 1)) == works


def test_a_near_tie_is_measured_now_and_then_a_clear_loss_never():
    from recguide_trt.runtime.policies.recguide import TIE_EXPLORE_EVERY, TIE_RATIO

    pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 4), switch_concurrency=0, warmup_rounds=0), 4, 3,
                         linear_cost(0.0, 1.0))
    b = pol.acceptance.no_history
    _set_rate(pol, b, 0.9)
    v4 = pol.step_value(b, 4, False)

    def plans(rel_rate, steps, reqs):
        pol._t = lambda c, tokens, adapter=True: 1.0 if tokens <= 1 else v4 / rel_rate
        pol._memo_state = None
        return [pol.plan(reqs, StepContext(4, s)) for s in range(steps)]

    reqs = [request(0), request(1), request(2, remaining=1), request(3)]
    # Block 4 rated 0.95x AR: the chooser runs AR, and every TIE_EXPLORE_EVERY-th step drafts block 4
    # (a request with one token left stays AR).
    steps = plans(0.95, 4 * TIE_EXPLORE_EVERY, reqs)
    drafting = [w for w in steps if any(x.kind is Kind.DRAFT for x in w)]
    assert len(drafting) == 4 and pol.tie_rounds == 4
    assert drafting[0] == [Work(0, Kind.DRAFT, 4), Work(1, Kind.DRAFT, 4), Work(2, Kind.AR), Work(3, Kind.DRAFT, 4)]
    assert all(x.kind is Kind.AR for w in steps if w not in drafting for x in w)
    # A step where some request holds a draft verifies it and explores nothing.
    held = [request(0, draft=Draft([11, 12, 13], MismatchPrediction(2, 21))), request(1)]
    assert all(pol.plan(held, StepContext(4, s)) == [Work(0, Kind.VERIFY, 4), Work(1, Kind.AR)]
               for s in range(2 * TIE_EXPLORE_EVERY))
    # Rated below TIE_RATIO of AR: never.
    assert not any(x.kind is Kind.DRAFT for w in plans(TIE_RATIO - 0.02, 4 * TIE_EXPLORE_EVERY, reqs) for x in w)
    # The per-request path (all_ar says no, the chooser still gives everyone AR) explores alike.
    pol.all_ar = lambda n, c: False
    steps = plans(0.95, 2 * TIE_EXPLORE_EVERY, reqs)
    assert sum(any(x.kind is Kind.DRAFT for x in w) for w in steps) == 2


def test_refit_relearns_a_cell_not_run_for_a_long_time():
    from recguide_trt.runtime.cost_refit import STALE_HALF_LIFE, RefittedCostTable

    table = CostTable([4], [1, 4], [[1.0, 2.0]], plain=[[1.0, 1.5]])
    refit = RefittedCostTable(table, min_samples=8)
    for _ in range(60):                      # the draft cell, priced 10 % too high by the table
        refit.observe(4, 4, 2.2, adapter=True)
    for _ in range(4 * STALE_HALF_LIFE):     # then AR only, for a long time
        refit.observe(4, 1, 1.0, adapter=False)
    for _ in range(8):                       # a near-tie is tried again: the draft cell now costs 2.0
        refit.observe(4, 4, 2.0, adapter=True)
    refit._update_factors()
    assert refit.step_time(4, 4) == pytest.approx(2.0, rel=0.02)   # at alpha each: ~2.16


def test_prospective_drafts_are_rated_apart_from_draft_forwards():
    """A block drafted by a prospective row is accepted less than one from a draft forward: the
    acceptance model (what the adaptive mode prices) learns from the latter only, and the overlap's
    value scales its hit share by the measured ratio."""
    from recguide_trt.runtime.policies.recguide import ORIGIN_PRIOR

    pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 4)), 4, 3, linear_cost(0.0, 1.0))
    b = pol.acceptance.no_history
    assert pol.prospective_ratio(4) == 1.0                      # nothing measured: no discount
    plain = Draft([11, 12, 13], MismatchPrediction(-1, -1))
    guessed = Draft([11, 12, 13], MismatchPrediction(-1, -1), prospective=True)
    for i in range(64):
        pol.observe(request(i, draft=plain), Round(4, 3), None, would_hit=False)   # 4 tokens a round
        pol.observe(request(i, draft=guessed), Round(4, 1), True)                  # 2 tokens a round
    assert pol.acceptance.attempts.sum() == pytest.approx(_attempts_after(64))
    e = pol.acceptance.expected_tokens(b, 4)
    plain_mean = (64 * 4 + ORIGIN_PRIOR * e) / (64 + ORIGIN_PRIOR)  # the draft forwards' mean, shrunk to the model's
    assert pol.prospective_ratio(4) == pytest.approx((64 * 2 + ORIGIN_PRIOR * plain_mean) / (64 + ORIGIN_PRIOR)
                                                     / plain_mean)
    assert e > 3.5                                               # the prospective rounds did not pull it down
    h = pol.block_hit_rate(4)
    assert pol.step_value(b, 4, False) == pytest.approx(e / 2)
    assert pol.step_value(b, 4, True) == pytest.approx(e * (1 - h + h * pol.prospective_ratio(4)) / (2 - h))


def _attempts_after(rounds: int) -> float:
    """Attempts an acceptance model records for ``rounds`` fully accepted L4 rounds of one bin."""
    m = AcceptanceModel(4)
    for _ in range(rounds):
        m.update(m.no_history, 4, 3)
    return float(m.attempts.sum())


def test_chooser_recomputes_once_per_acceptance_epoch():
    from recguide_trt.runtime.acceptance_model import EPOCH_ROUNDS

    pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 8)), 8, 3, linear_cost(1e-3, 1.0))
    calls = []
    inner = pol._choose_padded
    pol._choose_padded = lambda *a: calls.append(1) or inner(*a)
    b = pol.acceptance.no_history
    keys = [(b, 8)] * 4
    pol.choose_blocks(keys, 4, False)
    for _ in range(EPOCH_ROUNDS - 1):   # rounds inside one epoch: answered from the memo
        pol.acceptance.update(b, 8, 3)
        pol.choose_blocks(keys, 4, False)
    assert len(calls) == 1
    pol.acceptance.update(b, 8, 3)        # the epoch turns
    pol.choose_blocks(keys, 4, False)
    assert len(calls) == 2
    _set_rate(pol, b, 0.5)                # a direct edit (refresh) turns it at once
    pol.choose_blocks(keys, 4, False)
    assert len(calls) == 3


def test_a_larger_block_must_win_by_the_choice_margin():
    # Step prices set so that block 4 yields 2 % (then 5 %) more tokens per second than AR.
    cost = linear_cost(0.0, 1.0)
    pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 4)), 4, 3, cost)
    b = pol.acceptance.no_history
    _set_rate(pol, b, 0.9)
    v4 = pol.step_value(b, 4, False)
    pol._t = lambda c, tokens, adapter=True: 1.0 if tokens <= 1 else v4 / 1.02   # block 4: +2 % tokens per second
    keys = [(b, 4)] * 4
    assert pol.choose_blocks(keys, 4, False)[1] == [1] * 4 and pol.all_ar(4, 4)
    strict = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 4), choice_margin=0.0), 4, 3, cost)
    _set_rate(strict, b, 0.9)
    strict._t = pol._t
    assert strict.choose_blocks(keys, 4, False)[1] == [4] * 4 and not strict.all_ar(4, 4)
    pol._t = lambda c, tokens, adapter=True: 1.0 if tokens <= 1 else v4 / 1.05   # +5 %: beyond the margin
    pol._memo_state = None
    assert pol.choose_blocks(keys, 4, False)[1] == [4] * 4
    with pytest.raises(ValueError, match="choice_margin"):
        RecGuidePolicy(RecGuideConfig(choice_margin=-0.1), 4, 3)
    with pytest.raises(ValueError, match="flag_rule must be one of likelihood, threshold"):
        RecGuidePolicy(RecGuideConfig(flag_rule="first"), 4, 3)


def test_overlap_waits_for_measured_hits_by_default():
    """No hit measured yet: the default prior does not pay for fused rows on a guess (plain verifies
    measure the hit rate for free); measured would-be hits then turn overlap on."""
    pol = RecGuidePolicy(RecGuideConfig(), 8, 3, linear_cost(0.001, 1.0), max_concurrency=8)
    assert pol.derived_switch() == 0 and pol.choose_mode(1, 0) == ADAPTIVE
    r = request(draft=Draft([11, 12, 13], MismatchPrediction(2, 21)))
    for _ in range(100):
        pol.observe(r, Round(4, 1), None, would_hit=True)
    assert pol.derived_switch() >= 1 and pol.choose_mode(1, 10**6) == OVERLAP


def test_hit_rates_are_learned_per_block():
    """A long block's fused rows are priced with its own (lower) hit rate, not the short blocks'."""
    pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 4, 8)), 8, 3, linear_cost(0.001, 1.0))
    r = request(draft=Draft([11, 12, 13], MismatchPrediction(2, 21)))
    for i in range(200):
        pol.observe(r, Round(4, 1), None, would_hit=i % 5 != 0)   # L4: 0.8
        pol.observe(r, Round(8, 1), None, would_hit=i % 5 == 0)   # L8: 0.2
    assert pol.block_hit_rate(4) > 0.75 and pol.block_hit_rate(8) < 0.25
    assert abs(pol.hit_rate - 0.5) < 0.02
    assert abs(pol.block_hit_rate(16) - pol.hit_rate) < 1e-12   # unseen: the pooled rate
    expected = pol.acceptance.expected_tokens(pol.acceptance.no_history, 8)
    assert pol.step_value(pol.acceptance.no_history, 8, True) == pytest.approx(expected / (2 - pol.block_hit_rate(8)))
    assert pol.stats()["block_hit_rates"] == {4: 0.8, 8: 0.2}


def test_a_young_policy_rederives_its_switch_point_soon():
    """The first switch point sees no measured hit (pessimistic prior): it is re-derived after
    FIRST_REFRESH steps and then at doubling intervals, not only after ``refresh_steps``."""
    from recguide_trt.runtime.policies.recguide import FIRST_REFRESH

    pol = RecGuidePolicy(RecGuideConfig(), 8, 3, linear_cost(0.001, 1.0), max_concurrency=8)
    assert pol.choose_mode(1, 1000) == ADAPTIVE
    r = request(draft=Draft([11, 12, 13], MismatchPrediction(2, 21)))
    for _ in range(100):
        pol.observe(r, Round(4, 1), None, would_hit=True)
    assert pol.choose_mode(1, 1000 + FIRST_REFRESH - 1) == ADAPTIVE   # not yet
    assert pol.choose_mode(1, 1000 + FIRST_REFRESH) == OVERLAP
    old = RecGuidePolicy(RecGuideConfig(), 8, 3, linear_cost(0.001, 1.0), max_concurrency=8)
    old.choose_mode(1, 0)
    old.choose_mode(1, 4096)       # an old policy: the interval has grown to refresh_steps
    for _ in range(100):
        old.observe(r, Round(4, 1), None, would_hit=True)
    assert old.choose_mode(1, 4096 + 511) == ADAPTIVE and old.choose_mode(1, 4096 + 512) == OVERLAP


def test_overlap_plan_builds_prospective_rows():
    pol = RecGuidePolicy(RecGuideConfig(switch_concurrency=100, candidate_blocks=(1, 4)), 4, 3, linear_cost(0, 1))
    flagged = request(0, draft=Draft([11, 12, 13], MismatchPrediction(2, 21)))
    clean = request(1, draft=Draft([11, 12, 13], MismatchPrediction(-1, -1)))
    fresh = request(2)
    works = pol.plan([flagged, clean, fresh], StepContext(3, 0))
    assert works[0] == Work(0, Kind.FUSED, 4, Prospective(shared=2, first_token=21, block=4))
    assert works[1] == Work(1, Kind.FUSED, 4, Prospective(shared=4, first_token=3, block=4))
    assert works[2] == Work(2, Kind.DRAFT, 4)
    skip = RecGuidePolicy(RecGuideConfig(switch_concurrency=100, candidate_blocks=(1, 4), continuation="skip"),
                          4, 3, linear_cost(0, 1))
    assert skip.plan([clean], StepContext(1, 0))[0].kind is Kind.VERIFY


def test_recguide_verifies_a_lookup_where_it_gives_a_draft_block():
    """Where the context holds the last 2-gram earlier, the block RecGuide chose becomes a lookup verify (no draft
    forward); an AR choice stays AR; ``lookup=False`` drafts; a lookup round teaches the acceptance model nothing."""
    cfg = RecGuideConfig(switch_concurrency=100, candidate_blocks=(1, 4))
    pol = RecGuidePolicy(cfg, 4, 3, linear_cost(0, 1))
    copy = request(0)
    copy.prompt_ids, copy.output_ids = [5, 6, 7, 8, 9, 10, 5], [6]  # "5 6" seen before: 7 8 9 follow
    plain = request(1)
    works = pol.plan([copy, plain], StepContext(2, 0))
    assert works[0] == Work(0, Kind.VERIFY, 4, lookup=(7, 8, 9))
    assert works[1] == Work(1, Kind.DRAFT, 4)
    off = RecGuidePolicy(RecGuideConfig(switch_concurrency=100, candidate_blocks=(1, 4), lookup=False), 4, 3,
                         linear_cost(0, 1))
    assert off.plan([copy], StepContext(1, 0))[0] == Work(0, Kind.DRAFT, 4)
    ar_only = RecGuidePolicy(RecGuideConfig(switch_concurrency=100, candidate_blocks=(1,)), 4, 3, linear_cost(0, 1))
    assert ar_only.plan([copy], StepContext(1, 0))[0] == Work(0, Kind.AR)
    before = pol.acceptance.attempts.sum()
    copy.draft = Draft([7, 8, 9], MismatchPrediction(-1, -1), lookup=True)
    pol.observe(copy, Round(4, 2), None, True)
    assert pol.acceptance.attempts.sum() == before and pol.counterfactual == 0


def fake_out(argmax_row, top_rows, T):
    B = 1
    argmax = np.zeros((B, T), np.int64)
    argmax[0, :len(argmax_row)] = argmax_row
    top = np.zeros((B, T, 3), np.int64)
    for i, row in enumerate(top_rows):
        top[0, i] = row
    return ForwardOutput(argmax=argmax, top_ids=top, top_probs=np.full((B, T, 2), [0.9, 0.05], np.float32))


@pytest.mark.parametrize("verifier,hit", [
    ([11, 21, 0, 0], True),      # accepts d1, then emits B=21 at p=2: hit
    ([11, 22, 0, 0], False),     # cut at p but a different token
    ([15, 0, 0, 0], False),      # cut earlier
    ([11, 12, 13, 40], False),   # full accept: the correction row was for p=2
])
def test_hit_rule_correction(verifier, hit):
    ex = Executor(None, mask_token_id=3, eos_token_id=2, tau=0.5)
    r = request(draft=Draft([11, 12, 13], MismatchPrediction(2, 21)))
    w = Work(0, Kind.FUSED, 4, Prospective(shared=2, first_token=21, block=3))
    top = [[0, 0, 0]] * 4 + [[21, 0, 0], [31, 0, 0], [32, 0, 0]]
    d = ex.decide([w], [r], fake_out(verifier, top, 7))[0]
    assert d.hit is hit
    # A plain verify of the same draft reports the same fate for the row it did not run.
    plain = ex.decide([Work(0, Kind.VERIFY, 4)], [r], fake_out(verifier, top[:4], 4))[0]
    assert plain.would_hit is hit and plain.hit is None and plain.emitted == d.emitted
    if hit:
        assert d.emitted == [11, 21] and d.committed == 2 and d.draft.tokens == [31, 32]
    else:
        assert d.draft is None


def test_hit_rule_continuation():
    ex = Executor(None, mask_token_id=3, eos_token_id=2, tau=0.5)
    r = request(draft=Draft([11, 12, 13], MismatchPrediction(-1, -1)))
    w = Work(0, Kind.FUSED, 4, Prospective(shared=4, first_token=3, block=3))
    top = [[0, 0, 0]] * 4 + [[40, 0, 0], [41, 0, 0], [42, 0, 0]]
    d = ex.decide([w], [r], fake_out([11, 12, 13, 40], top, 7))[0]
    assert d.hit and d.emitted == [11, 12, 13, 40] and d.draft.tokens == [41, 42]
    d = ex.decide([w], [r], fake_out([11, 12, 13, 44], top, 7))[0]
    assert d.hit is False
    # Bidirectional seed: a continuation row's own bonus guess decides, unknowable from a verify.
    plain = ex.decide([Work(0, Kind.VERIFY, 4)], [r], fake_out([11, 12, 13, 40], top[:4], 4))[0]
    assert plain.would_hit is None
    causal = Executor(None, mask_token_id=3, eos_token_id=2, tau=0.5, seed_causal=True)
    assert causal.decide([Work(0, Kind.VERIFY, 4)], [r], fake_out([11, 12, 13, 40], top[:4], 4))[0].would_hit is True
    assert causal.decide([Work(0, Kind.VERIFY, 4)], [r], fake_out([11, 12, 7, 0], top[:4], 4))[0].would_hit is False


def test_hit_rate_keeps_learning_without_overlap():
    """Plain verifies report would-be hits, so a poor early estimate cannot end overlap for good."""
    pol = RecGuidePolicy(RecGuideConfig(prior_hit_rate=0.1), 8, 3, linear_cost(1.0, 0.5))
    r = request(draft=Draft([11, 12, 13], MismatchPrediction(2, 21)))
    for _ in range(200):
        pol.observe(r, Round(4, 1), None, would_hit=True)
    assert pol.hit_rate > 0.9 and pol.prospective == 0 and pol.counterfactual == 200
    # continuation="skip" runs no prospective row for an unflagged draft: nothing to count.
    skip = RecGuidePolicy(RecGuideConfig(continuation="skip"), 8, 3, linear_cost(1.0, 0.5))
    skip.observe(request(draft=Draft([11, 12, 13], MismatchPrediction(-1, -1))), Round(4, 3), None, True)
    assert skip.counterfactual == 0


def test_fused_row_equals_plain_verify_and_leaves_the_same_cache():
    cfg = tiny_config()
    model = random_model(cfg, seed=7)
    prompt = [int(x) for x in np.random.default_rng(0).integers(4, 96, 12)]
    draft = Draft([20, 21, 22], MismatchPrediction(2, 30))

    def run(kind, prospective=None):
        backend = TorchBackend(model, max_slots=2, slot_capacity=64)
        ex = Executor(backend, cfg.mask_token_id, cfg.eos_token_id, 0.5)
        r = request(draft=None)
        r.prompt_ids, r.slot = prompt, 0
        r.seed, r.cache_len = None, 0
        backend.forward(ex.pack([Work(0, Kind.PREFILL)], [r]))
        r.seed, r.cache_len, r.draft = 44, len(prompt), draft
        out = backend.forward(ex.pack([Work(0, kind, 4, prospective)], [r]))
        committed = len(prompt) + 4
        cache = [k[0, :, :committed].clone() for k in backend.k_cache + backend.v_cache]
        return out, cache, ex, r, backend

    plain, plain_cache, *_ = run(Kind.VERIFY)
    fused, fused_cache, *_ = run(Kind.FUSED, Prospective(2, 30, 4))
    np.testing.assert_array_equal(fused.argmax[0, :4], plain.argmax[0, :4])
    np.testing.assert_allclose(fused.top_probs[0, :4], plain.top_probs[0, :4], rtol=1e-5, atol=1e-6)
    for a, b in zip(fused_cache, plain_cache):
        torch.testing.assert_close(a, b)
    # The prospective row drafts what a plain draft forward would, after committing (44, 20) and
    # seeding the correction token 30.
    n = len(prompt) + 2
    _, kv = model(torch.tensor([prompt + [44, 20]]), torch.arange(n)[None], torch.from_numpy(masks.causal(n))[None])
    dmask = torch.ones(1, 4, n + 4, dtype=torch.bool)
    dl, _ = model(torch.tensor([[30, 3, 3, 3]]), (n + torch.arange(4))[None], dmask, past_kv=kv)
    dl[..., cfg.mask_token_id] = -float("inf")
    np.testing.assert_array_equal(fused.top_ids[0, 4:8, 0], dl[0].argmax(-1).numpy())


def test_newcomers_get_the_population_estimate():
    """A request with no drafted round is judged by every bin's outcomes, so it is not stuck in AR."""
    m = AcceptanceModel(max_block=8, prior_accept=0.2, prior_strength=2.0)
    newcomer = m.history_bin([])
    good = m.history_bin([Round(8, 6)] * 4)
    assert newcomer == m.no_history and good != newcomer
    before = m.expected_tokens(newcomer, 8)
    for _ in range(300):
        m.update(good, 8, 6)   # only requests with history draft (newcomers were given AR)
    assert m.expected_tokens(newcomer, 8) > before + 3
    assert m.expected_tokens(newcomer, 8) == pytest.approx(m.expected_tokens(good, 8), rel=0.05)


def test_warmup_drafts_until_rounds_are_observed():
    """A prior under which AR looks best must not stop the policy from ever measuring a draft."""
    pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 2, 4), switch_concurrency=0, warmup_rounds=4), 4, 3,
                         linear_cost(1.0, 1.0))
    pol.acceptance.prior_accept = 0.05
    pol.acceptance.refresh()
    reqs = [request(i) for i in range(3)]
    ctx = StepContext(concurrency=3, step=0)
    assert all(w.kind is Kind.DRAFT for w in pol.plan(reqs, ctx))
    b = pol.acceptance.history_bin([])
    for _ in range(4):
        pol.acceptance.update(b, 4, 0)   # measured: drafts are rejected
    assert all(w.kind is Kind.AR for w in pol.plan(reqs, ctx))


def test_warmup_drafts_the_block_with_the_most_tokens_per_second():
    """While young, a request the chooser gives AR drafts the block that pays best for its price, not the
    largest one (on a CPU where a 16-token forward costs several AR steps, 16-token warm-up rounds ran at
    half AR's speed); without a cost table, the most tokens per step."""
    def plan_block(cost):
        pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 2, 4, 16), switch_concurrency=0,
                                            warmup_rounds=4), 16, 3, cost)
        pol.acceptance.prior_accept = 0.05
        pol.acceptance.refresh()
        [work] = pol.plan([request(0)], StepContext(concurrency=1, step=0))
        assert work.kind is Kind.DRAFT
        return work.block

    assert plan_block(linear_cost(1.0, 1.0)) == 2
    assert plan_block(None) == 16


def test_chooser_memo_follows_what_the_choice_depends_on():
    from recguide_trt.runtime.cost_refit import RefittedCostTable

    cost = RefittedCostTable(linear_cost(1e-3, 1.0), min_samples=1)
    pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 8)), 8, 3, cost)
    b = pol.acceptance.history_bin([])
    _set_rate(pol, b, 0.05)
    keys = [(b, 8)] * 4
    assert pol.choose_blocks(keys, 4, False)[1] == [1] * 4
    assert pol.choose_blocks(keys, 4, False)[1] == [1] * 4      # memo
    for _ in range(3000):                                        # verify rounds: acceptance moves
        pol.acceptance.update(b, 8, 7)
    assert pol.choose_blocks(keys, 4, False)[1] == [8] * 4
    cost.observe(4, 1, cost.table.step_time(4, 1))               # refit: AR steps cost what the table says,
    assert pol.choose_blocks(keys, 4, False)[1] == [8] * 4
    cost.observe(4, 8, 1e3)                                      # block-8 steps far more
    assert pol.choose_blocks(keys, 4, False)[1] == [1] * 4


def test_untried_deep_positions_borrow_the_population_estimate():
    """A bin that only drafted short blocks rates deep positions by what other bins measured
    there, not by extrapolating its own last position (deep acceptance is higher)."""
    m = AcceptanceModel(max_block=16, prior_accept=0.5, prior_strength=4.0)
    short = m.history_bin([Round(8, 3)] * 4)
    deep = m.history_bin([Round(16, 15)] * 4)
    assert short != deep
    rng = np.random.default_rng(0)
    for _ in range(400):
        m.update(short, 8, int(rng.integers(2, 8)))       # positions 1-7 only, ~0.7 each
        m.update(deep, 16, 15)                             # positions 1-15, all accepted
    probs = m.accept_probs(short)
    pooled = m.accept_probs(m.no_history)
    assert probs[2:6].max() < 0.9                           # its own data where it has some
    assert probs[10] == pytest.approx(pooled[10], rel=1e-6) and probs[10] > 0.95
    # Nobody drafted that deep: the bin's own deepest rate, as before.
    lone = AcceptanceModel(max_block=16, prior_accept=0.5, prior_strength=4.0)
    for _ in range(400):
        lone.update(short, 8, 7)
    assert lone.accept_probs(short)[12] == pytest.approx(lone.accept_probs(short)[6], abs=0.02)


def test_a_block_rarely_drafted_plainly_is_not_rated_by_its_few_rounds():
    """The draft forwards' own mean is shrunk towards the acceptance model's expectation: two unlucky plain
    rounds of a block no longer make its prospective rounds look better than draft forwards."""
    pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 4, 6)), 6, 3, linear_cost(0.0, 1.0))
    plain = Draft([11, 12, 13, 14, 15], MismatchPrediction(-1, -1))
    guessed = Draft([11, 12, 13, 14, 15], MismatchPrediction(-1, -1), prospective=True)
    for i in range(64):  # the model learns from L4's draft forwards: every round accepted whole
        pol.observe(request(i, draft=Draft([11, 12, 13], MismatchPrediction(-1, -1))), Round(4, 3), None,
                    would_hit=False)
    for i in range(2):
        pol.observe(request(i, draft=plain), Round(6, 0), None, would_hit=False)  # two plain L6 rounds: 1 token
    for i in range(8):
        pol.observe(request(i, draft=guessed), Round(6, 3), True)                 # prospective L6 rounds: 4 tokens
    # By its two rounds alone the ratio would read 4 / 1 (shrunk: ~2.8); by the model's expectation it is ~1.
    assert pol.prospective_ratio(6) < 1.1


def test_an_unmeasured_blocks_hit_rate_leans_on_its_full_accept_chance():
    """A block the policy never fused nor verified plainly is not priced at the pooled hit rate of the block it
    did run when the acceptance model says its drafts are accepted whole more often than that."""
    pol = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 4, 8)), 8, 3, linear_cost(0.0, 1.0))
    miss = Draft([11, 12, 13, 14, 15, 16, 17], MismatchPrediction(2, 40))
    for i in range(200):  # L8 verifies: cut after 2-3 tokens, never the bet
        pol.observe(request(i, draft=miss), Round(8, 2 + i % 2), None, would_hit=False)
    assert pol.hit_rate < 0.05
    full4 = pol.full_accept_share(4)
    assert full4 > 0.3 and pol.block_hit_rate(4) == pytest.approx(full4)
    assert pol.block_hit_rate(8) < 0.05                                   # measured: its own rate
    skip = RecGuidePolicy(RecGuideConfig(candidate_blocks=(1, 4, 8), continuation="skip"), 8, 3,
                          linear_cost(0.0, 1.0))
    assert skip.full_accept_share(4) == 0.0                               # no row bets on a full accept there
