"""``SamplingParams.logprobs``: each output token's log-probability, the same under every policy as under AR."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recguide_trt import LLM, SamplingParams
from recguide_trt.model import masks
from recguide_trt.model.checkpoint import load_checkpoint
from recguide_trt.runtime.logprobs import MAX_LOGPROBS, token_logprobs, top_ids
from recguide_trt.runtime.params import PEER_CONTROLLERS
from tests.conftest import EMBEDDED, has_embedded

needs_tiny = pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")
PROMPTS = [f"def function_{i}(x):\n    " if i % 2 else f"import os\nclass Widget{i}:\n    " for i in range(12)]


def test_token_logprobs_match_torch_and_break_ties_by_id():
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(5, 300)).astype(np.float32) * 4
    rows[2, [7, 11, 40]] = 30.0  # a three-way tie at the top
    tokens = [3, 8, 11, 299, 0]
    out = token_logprobs(rows, tokens, top=4)
    ref = torch.log_softmax(torch.from_numpy(rows).double(), -1)
    for i, e in enumerate(out):
        assert e.token_id == tokens[i]
        assert e.logprob == pytest.approx(float(ref[i, tokens[i]]), abs=1e-6)  # exp in float32, sums in float64
        order = sorted(range(300), key=lambda v: (-float(ref[i, v]), v))[:4]
        assert [t for t, _ in e.top] == order
        assert [lp for _, lp in e.top] == pytest.approx([float(ref[i, v]) for v in order], abs=1e-6)
    assert [t for t, _ in out[2].top][:3] == [7, 11, 40]
    assert token_logprobs(rows[:1], [5], top=0)[0].top == ()


@pytest.mark.parametrize("k", [1, 5, 20])
def test_top_ids_equal_a_full_sort_with_many_ties(k):
    """top_ids sorts only the values at or above a block-maxima bound: the same ids as sorting the whole row."""
    rng = np.random.default_rng(k)
    for width in (1000, 49152, 70):
        for row in (rng.integers(-40, 8, size=width).astype(np.float32),  # few distinct values: ties everywhere
                    rng.normal(size=width).astype(np.float32)):           # distinct values
            expect = sorted(range(width), key=lambda v: (-row[v], v))[:k]
            assert top_ids(row, k).tolist() == expect


@pytest.mark.parametrize("bad", [-1, MAX_LOGPROBS + 1, True, 1.5, "2"])
def test_bad_logprobs_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=bad).validate()


def _teacher_forced(model, prompt: list[int], out: list[int]) -> torch.Tensor:
    """log-softmax of the model's causal logits at the positions that predict ``out``."""
    seq = torch.tensor([prompt + out])
    T = seq.shape[1]
    wanted = torch.arange(len(prompt) - 1, T - 1)[None]
    with torch.no_grad():
        logits, _ = model(seq, torch.arange(T)[None], torch.from_numpy(masks.causal(T))[None], logit_index=wanted)
    return torch.log_softmax(logits[0].double(), -1)


@needs_tiny
def test_every_policy_reports_ar_logprobs_bit_for_bit():
    llm = LLM("tiny")
    ref = llm.generate(PROMPTS, SamplingParams(max_tokens=40, policy="ar", logprobs=3))
    model = load_checkpoint(EMBEDDED, dtype="float32").model.eval()
    for r, p in zip(ref[:4], PROMPTS):
        assert len(r.logprobs) == len(r.token_ids)
        lp = _teacher_forced(model, llm.encode(p), r.token_ids)
        got = [e.logprob for e in r.logprobs]
        assert got == pytest.approx(lp[torch.arange(len(r.token_ids)), r.token_ids].tolist(), abs=2e-4)
        assert [e.top[0][0] for e in r.logprobs] == r.token_ids  # greedy: the emitted token is the most likely
    for policy, block in [("linearspec", 4), ("linearspec", 8), ("recguide", None), (PEER_CONTROLLERS[0], None)]:
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=40, policy=policy, block_size=block, logprobs=3))
        assert sum(o.metrics.accepted_draft_tokens for o in outs) > 0, policy  # verify rows were read
        for o, r in zip(outs, ref):
            assert o.token_ids == r.token_ids
            assert o.logprobs == r.logprobs, (policy, block)


@needs_tiny
def test_logprobs_follow_truncation_and_sampling():
    llm = LLM("tiny")
    # max_tokens cuts a verified block short: one logprob per token still
    for o in llm.generate(PROMPTS[:4], SamplingParams(max_tokens=5, policy="linearspec", block_size=8, logprobs=0)):
        assert len(o.token_ids) == len(o.logprobs) == 5
        assert all(e.top == () for e in o.logprobs)
    model = load_checkpoint(EMBEDDED, dtype="float32").model.eval()
    outs = llm.generate(PROMPTS[:4], SamplingParams(max_tokens=24, temperature=0.9, seed=3, policy="recguide",
                                                    logprobs=1))
    for o, p in zip(outs, PROMPTS):
        assert len(o.logprobs) == len(o.token_ids)
        lp = _teacher_forced(model, llm.encode(p), o.token_ids)
        # the model's own distribution at temperature 1, whatever the request sampled at
        assert [e.logprob for e in o.logprobs] == pytest.approx(
            lp[torch.arange(len(o.token_ids)), o.token_ids].tolist(), abs=2e-4)
    assert llm.generate(PROMPTS[:1], SamplingParams(max_tokens=4))[0].logprobs is None


@needs_tiny
def test_prompt_logprobs_cover_every_prompt_token_and_skip_the_prefix_cache():
    llm = LLM("tiny")
    model = load_checkpoint(EMBEDDED, dtype="float32").model.eval()
    params = SamplingParams(max_tokens=3, prompt_logprobs=2, policy="linearspec")
    first = llm.generate(PROMPTS[:3], params)
    again = llm.generate(PROMPTS[:3], params)  # the prefix cache holds these prompts now
    for a, b, p in zip(first, again, PROMPTS):
        ids = llm.encode(p)
        assert [e.token_id for e in a.prompt_logprobs] == ids[1:]
        seq = torch.tensor([ids])
        with torch.no_grad():
            logits, _ = model(seq, torch.arange(len(ids))[None], torch.from_numpy(masks.causal(len(ids)))[None],
                              logit_index=torch.arange(len(ids) - 1)[None])
        ref = torch.log_softmax(logits[0].double(), -1)[torch.arange(len(ids) - 1), ids[1:]]
        assert [e.logprob for e in a.prompt_logprobs] == pytest.approx(ref.tolist(), abs=2e-4)
        assert all(len(e.top) == 2 for e in a.prompt_logprobs)
        assert b.metrics.cached_prompt_tokens == 0 and b.prompt_logprobs == a.prompt_logprobs
        assert b.token_ids == a.token_ids and a.logprobs is None
    plain = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=3, policy="linearspec"))[0]
    assert plain.prompt_logprobs is None and plain.metrics.cached_prompt_tokens > 0  # the cache still serves others
