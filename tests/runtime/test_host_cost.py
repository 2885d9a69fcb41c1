"""Host work is priced next to the forward; RecGuide measures AR's own price before trusting it."""

from __future__ import annotations

import numpy as np
import pytest

from recguide_trt.runtime.cost_model import CostTable
from recguide_trt.runtime.cost_refit import RefittedCostTable
from recguide_trt.runtime.host_cost import MIN_SAMPLES, HostCostModel
from recguide_trt.runtime.plan import Kind
from recguide_trt.runtime.policies.base import StepContext
from recguide_trt.runtime.policies.recguide import EXPLORE_EVERY, RecGuideConfig, RecGuidePolicy
from tests.runtime.test_policies import linear_cost, request


def truth(b, t, adapter):
    return 1e-5 * b + 1e-6 * b * t + 4e-5 * b * adapter


def test_host_model_recovers_a_linear_cost():
    m = HostCostModel()
    rng = np.random.default_rng(0)
    assert m.predict(4, 8, True) == 0.0  # nothing measured: no price yet
    for _ in range(400):
        b, t, a = int(rng.integers(1, 65)), int(rng.choice([1, 2, 4, 8, 16])), bool(rng.integers(0, 2))
        m.observe(b, t, truth(b, t, a), a)
    for b, t, a in ((1, 1, False), (64, 1, False), (1, 16, True), (32, 8, True)):
        assert m.predict(b, t, a) == pytest.approx(truth(b, t, a), rel=1e-3)
    assert m.version > 0 and (m.coef >= 0).all()


def test_one_batch_size_for_a_long_time_does_not_price_every_size_like_it():
    """A closed loop at C=64 for thousands of steps leaves only that shape in the fit: its host work
    must not become a per-step price of a C=1 step (a constant term once took all of it)."""
    m = HostCostModel()
    for b in (1, 2, 4):                  # some low-load steps first, then a long C=64 phase
        for _ in range(50):
            m.observe(b, 1, 60e-6 * b, False)
    for _ in range(3000):
        m.observe(64, 1, 3.3e-3, False)
    assert m.predict(64, 1, False) == pytest.approx(3.3e-3, rel=1e-3)
    assert m.predict(1, 1, False) == pytest.approx(3.3e-3 / 64, rel=1e-3)   # per row, not per step


def test_refit_prices_forward_plus_host():
    table = CostTable([1, 8], [1, 8], [[1e-3, 2e-3], [3e-3, 9e-3]])
    r = RefittedCostTable(table)
    v0 = r.version
    for _ in range(MIN_SAMPLES + 40):
        for b, t, a in ((1, 8, True), (1, 1, False), (8, 1, False), (8, 8, True)):
            r.observe_host(b, t, truth(b, t, a), a)
    assert r.version != v0
    assert r.step_time(1, 8, True) == pytest.approx(2e-3 + truth(1, 8, True), rel=1e-3)
    assert r.step_time(1, 1, False) == pytest.approx(1e-3 + truth(1, 1, False), rel=1e-3)


def test_recguide_measures_ar_before_trusting_a_borrowed_price():
    cost = RefittedCostTable(linear_cost(1e-6, 1e-3))  # speculation looks cheap: blocks > 1 chosen
    pol = RecGuidePolicy(RecGuideConfig(switch_concurrency=0, candidate_blocks=(1, 8)), 8, 3, cost)
    pol._warm = True
    reqs = [request(0)]
    kinds = [pol.plan(reqs, StepContext(concurrency=1, step=s))[0].kind for s in range(4 * EXPLORE_EVERY)]
    assert kinds.count(Kind.AR) == 4 and Kind.DRAFT in kinds  # one AR step in every EXPLORE_EVERY chances
    for _ in range(cost.min_samples):
        cost.observe(1, 1, 1e-3, adapter=False)
    assert cost.measured(1, 1, False)
    kinds = [pol.plan(reqs, StepContext(concurrency=1, step=s))[0].kind for s in range(4 * EXPLORE_EVERY)]
    assert Kind.AR not in kinds  # measured (and dearer than block 8 here): no more exploring
