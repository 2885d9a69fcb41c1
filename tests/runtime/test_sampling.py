"""Speculative sampling preserves the AR distribution (and the test notices when it does not)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recguide_trt import LLM, EngineConfig, SamplingParams
from recguide_trt.model import masks
from recguide_trt.runtime import executor as executor_mod
from recguide_trt.runtime.sampling import probs_from_logits, speculative_accept

from .helpers import flat_cost_table

PROMPT = [17, 42, 5, 88, 23, 61]
N = 3000
TOLERANCE = 0.08
"""Total-variation distance allowed between 3000 samples and the exact distribution.

With the ~20 outcomes that carry the mass here the sampling noise is about 0.03; accepting draft
tokens without the p/q test moves the distribution towards the draft's (TV > 0.2 on this model)."""


def exact_second_token(model) -> np.ndarray:
    """P(second output token) under AR sampling at temperature 1: sum over the first token."""
    n = len(PROMPT)
    with torch.no_grad():
        logits, _ = model(torch.tensor([PROMPT]), torch.arange(n)[None], torch.from_numpy(masks.causal(n))[None])
        p0 = torch.softmax(logits[0, -1].double(), -1)
        V = p0.shape[0]
        ids = torch.tensor([PROMPT + [t] for t in range(V)])
        logits, _ = model(ids, torch.arange(n + 1).expand(V, n + 1),
                          torch.from_numpy(masks.causal(n + 1)).expand(V, n + 1, n + 1))
        p1 = torch.softmax(logits[:, -1].double(), -1)
    return (p0[:, None] * p1).sum(0).numpy()


def empirical(llm, policy: str, index: int) -> np.ndarray:
    outs = llm.generate([PROMPT] * N, SamplingParams(max_tokens=4, temperature=1.0, policy=policy, block_size=4,
                                                     stop_at_eos=False))
    counts = np.bincount([o.token_ids[index] for o in outs], minlength=llm.config.vocab_size)
    return counts / counts.sum()


@pytest.fixture(scope="module")
def llm(random_ckpt):
    return LLM(random_ckpt, engine_config=EngineConfig(max_num_seqs=64, max_model_len=64, seed=1,
                                                       cost_table=flat_cost_table()))


@pytest.fixture(scope="module")
def llm_seed_causal(random_ckpt_seed_causal):
    return LLM(random_ckpt_seed_causal, engine_config=EngineConfig(max_num_seqs=64, max_model_len=64, seed=1,
                                                                   cost_table=flat_cost_table()))


def tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


def test_speculative_sampling_matches_ar_distribution(llm):
    exact = exact_second_token(llm.checkpoint.model)
    spec = empirical(llm, "linearspec", 1)
    assert tv(spec, exact) < TOLERANCE, tv(spec, exact)
    # Third token: compare against AR sampling itself (two-sample).
    assert tv(empirical(llm, "linearspec", 2), empirical(llm, "ar", 2)) < 1.5 * TOLERANCE


def test_speculative_sampling_with_a_causal_seed(llm_seed_causal):
    """d1 is sampled from the seed's AR distribution; d2 onwards still go through the p/q test."""
    llm = llm_seed_causal
    exact = exact_second_token(llm.checkpoint.model)
    assert tv(empirical(llm, "linearspec", 1), exact) < TOLERANCE
    assert tv(empirical(llm, "linearspec", 2), empirical(llm, "ar", 2)) < 1.5 * TOLERANCE


def test_the_check_catches_a_non_preserving_rule(llm, monkeypatch):
    """Accepting every sampled draft token (no p/q test) must fail the same check."""
    def accept_all(drafts, q, p, rng):
        return len(drafts), int(rng.choice(len(p[-1]), p=p[-1]))

    monkeypatch.setattr(executor_mod, "speculative_accept", accept_all)
    exact = exact_second_token(llm.checkpoint.model)
    assert tv(empirical(llm, "linearspec", 1), exact) > TOLERANCE


def test_speculative_accept_unit():
    rng = np.random.default_rng(0)
    V = 5
    p = np.tile(np.array([0.5, 0.2, 0.1, 0.1, 0.1]), (3, 1))
    q = np.tile(np.array([0.1, 0.6, 0.1, 0.1, 0.1]), (2, 1))
    firsts = []
    for _ in range(20000):
        d = [int(rng.choice(V, p=q[0])), int(rng.choice(V, p=q[1]))]
        c, nxt = speculative_accept(d, q, p, rng)
        firsts.append(d[0] if c >= 1 else nxt)
    emp = np.bincount(firsts, minlength=V) / len(firsts)
    assert tv(emp, p[0]) < 0.02


def test_top_p_filter():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    p = probs_from_logits(logits, 1.0, 0.7)
    np.testing.assert_allclose(p[0], [0.625, 0.375, 0, 0])
    assert probs_from_logits(logits, 1.0, 1.0)[0, 3] > 0


def _full_sort_nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """The top-p rule over a full stable sort: keep a token when the mass before it (descending, ties by id) is
    below top_p."""
    order = np.argsort(-p, kind="stable")
    before = np.concatenate([[0.0], np.cumsum(p[order])[:-1]])
    out = np.zeros_like(p)
    keep = order[before < top_p]
    out[keep] = p[keep] / p[keep].sum()
    return out


@pytest.mark.parametrize("scale", [0.5, 2.5, 8.0])
def test_nucleus_equals_a_full_sort(scale):
    """probs_from_logits sorts only candidates above a threshold: the same tokens and values as a full sort, on flat
    and peaked rows, with ties at the edge of the nucleus."""
    rng = np.random.default_rng(int(scale * 10))
    V = 5000
    for trial in range(12):
        logits = (rng.normal(size=(2, V)) * scale).astype(np.float32)
        logits[1, rng.integers(0, V, 40)] = logits[1].max()   # a block of ties at the top
        logits[:, rng.integers(0, V, 300)] = np.round(logits[:, :1], 1)  # ties lower down
        for top_p in (0.05, 0.5, 0.9, 0.999):
            got = probs_from_logits(logits, 0.8, top_p)
            full = probs_from_logits(logits, 0.8, 1.0)
            for row in range(2):
                want = _full_sort_nucleus(full[row], top_p)
                np.testing.assert_array_equal(got[row] > 0, want > 0, err_msg=f"{trial} {top_p}")
                np.testing.assert_allclose(got[row], want, rtol=1e-12, atol=0)


def test_sample_never_draws_a_dropped_token():
    from recguide_trt.runtime.sampling import sample

    rng = np.random.default_rng(0)
    p = np.zeros(1000)
    p[[3, 500, 999]] = [0.2, 0.5, 0.3]
    draws = [sample(p, rng) for _ in range(3000)]
    assert set(draws) == {3, 500, 999}
    assert abs(draws.count(500) / 3000 - 0.5) < 0.05
    assert sample(np.array([0.0, 0.0, 1e-300]), rng) == 2


def test_sample_follows_a_dense_row_across_blocks():
    """The two-level search (a block by its sum, then a token in it) draws each token at its probability."""
    from recguide_trt.runtime.sampling import SAMPLE_BLOCK, sample

    rng = np.random.default_rng(1)
    V = 3 * SAMPLE_BLOCK + 17                    # a short last block
    p = rng.random(V) ** 8
    p[SAMPLE_BLOCK:2 * SAMPLE_BLOCK] = 0.0        # a whole block of zeros
    p[-1] = p.sum()                               # the last token carries half the mass
    draws = np.bincount([sample(p * 3.0, rng) for _ in range(20000)], minlength=V)  # not normalised
    assert draws[SAMPLE_BLOCK:2 * SAMPLE_BLOCK].sum() == 0 and not draws[p == 0].any()
    assert tv(draws / draws.sum(), p / p.sum()) < 0.06
    assert abs(draws[-1] / 20000 - 0.5) < 0.015
