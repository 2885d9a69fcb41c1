"""The lossless suite's real-model leg: on SmolLM2-135M (the default model, with its shipped draft
adapter and draft sampler), every policy's greedy output equals the native backend's AR greedy output
exactly, alone and in one mixed batch.

The native backend's arithmetic is batch-invariant (a token's logits do not depend on the rows
beside it), so no near-tie tolerance is needed. AR itself is checked against transformers in
``tests/models/test_fidelity.py``.
"""

from __future__ import annotations

import pytest

from recguide_trt import LLM, EngineConfig, SamplingParams
from recguide_trt.bench.workloads import humaneval_prompts
from recguide_trt.runtime.params import PEER_CONTROLLERS
from recguide_trt.runtime.policies.recguide import RecGuideConfig

from .helpers import flat_cost_table

MAX_TOKENS = 40
QUESTIONS = ["What is the capital of France?", "Explain what a hash table is in two sentences.",
             "Write a haiku about autumn.", "How do I reverse a list in Python?"]
POLICIES = ([("linearspec", b) for b in (2, 4, 8, 16)] + [("recguide", None), ("lookup", None)]
            + [(p, None) for p in PEER_CONTROLLERS])


@pytest.fixture(scope="module")
def real():
    """(llm, prompts, AR outputs): chat questions through the chat template, and HumanEval code prompts."""
    llm = LLM("smollm2-135m", backend="native", engine_config=EngineConfig(
        max_num_seqs=8, max_model_len=1024, cost_table=flat_cost_table()))
    assert llm.engine.executor.sampler is not None  # the shipped adapter's draft sampler chooses the drafts
    prompts = [llm.encode(llm.chat_prompt([{"role": "user", "content": q}])) for q in QUESTIONS]
    prompts += [llm.encode(p)[-200:] for p in humaneval_prompts()[:40:10]]
    ar = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, policy="ar"))
    return llm, prompts, [o.token_ids for o in ar]


@pytest.fixture(scope="module")
def overlap():
    """SmolLM2 with RecGuide in overlap mode (fused prospective rows) at every C."""
    return LLM("smollm2-135m", backend="native", engine_config=EngineConfig(
        max_num_seqs=8, max_model_len=1024, cost_table=flat_cost_table(),
        recguide=RecGuideConfig(switch_concurrency=1000)))


def _check(outs, ar, what: str) -> None:
    for i, (o, ref) in enumerate(zip(outs, ar)):
        assert o.error is None, f"{what}: prompt {i}: {o.error}"
        assert o.token_ids == ref, f"{what}: prompt {i} differs from AR greedy:\n{o.token_ids}\n{ref}"


@pytest.mark.parametrize("policy,block", POLICIES)
def test_every_policy_equals_ar(real, policy, block):
    llm, prompts, ar = real
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, policy=policy, block_size=block))
    _check(outs, ar, f"{policy}/{block}")
    if policy == "linearspec":  # the causal seed's d1 is the AR token: at least one draft accepted per round
        assert min(o.metrics.mal for o in outs) >= 1.5, [o.metrics.mal for o in outs]
    if policy == "lookup":  # chat answers and code copy their prompts: rounds verify lookups with no draft forward
        forwards = {k: sum(o.metrics.forwards[k] for o in outs) for k in ("draft", "verify")}
        assert forwards["draft"] < forwards["verify"], forwards
    if (policy, block) == ("linearspec", 8):  # the shipped drafter is loaded and drafts past the seed (1.98 without)
        assert llm._checkpoint.model.draft_mask_embedding is not None
        mal = sum(o.metrics.decode_tokens for o in outs) / sum(o.metrics.rounds for o in outs)
        assert mal > 2.4, mal


def test_mixed_policies_in_one_batch_and_overlap(real, overlap):
    llm, prompts, ar = real
    mix = [SamplingParams(max_tokens=MAX_TOKENS, policy=p, block_size=b) for p, b in
           [("ar", None), *POLICIES]][:len(prompts)]
    _check(llm.generate(prompts, mix), ar, "mixed batch")
    outs = overlap.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, policy="recguide"))
    _check(outs, ar, "recguide overlap")
    assert sum(o.metrics.forwards["fused"] for o in outs) > 0


def test_logprobs_equal_ar_under_speculation_and_overlap(real, overlap):
    """SamplingParams.logprobs on the real model: LinearSpec's verify rows and RecGuide's fused rows report the
    AR step's log-probabilities bit for bit (the same logits), and the greedy token is the most likely one."""
    llm, prompts, ar = real
    params = dict(max_tokens=24, logprobs=2)
    ref = llm.generate(prompts, SamplingParams(policy="ar", **params))
    assert all(o.token_ids == a[:24] for o, a in zip(ref, ar))
    assert all([e.top[0][0] for e in o.logprobs] == o.token_ids for o in ref)
    for name, engine, policy in [("linearspec", llm, "linearspec"), ("recguide overlap", overlap, "recguide")]:
        outs = engine.generate(prompts, SamplingParams(policy=policy, **params))
        assert [o.logprobs for o in outs] == [o.logprobs for o in ref], name
    assert sum(o.metrics.forwards["fused"] for o in outs) > 0


def test_penalties_equal_ar_under_speculation_and_overlap(real, overlap):
    """Repetition and frequency penalties with a logit bias and min_tokens on the real model: LinearSpec 8 and
    RecGuide's fused rows equal AR under the same settings, and the settings change AR's output."""
    llm, prompts, ar = real
    params = dict(max_tokens=16, repetition_penalty=1.2, frequency_penalty=0.3, logit_bias={ar[0][0]: -100},
                  min_tokens=12)
    ref = [o.token_ids for o in llm.generate(prompts, SamplingParams(policy="ar", **params))]
    assert sum(r != a[:len(r)] for r, a in zip(ref, ar)) >= len(prompts) // 2
    for name, engine, policy in [("linearspec", llm, "linearspec"), ("recguide overlap", overlap, "recguide")]:
        outs = engine.generate(prompts, SamplingParams(policy=policy, block_size=8, **params))
        assert [o.token_ids for o in outs] == ref, name
    assert sum(o.metrics.forwards["fused"] for o in outs) > 0


def test_bf16_compute_is_lossless_against_its_own_ar(real):
    """compute_dtype="bfloat16" (bf16 dot products into float32 sums) with kv_cache_dtype="bfloat16": LinearSpec
    and RecGuide on every prompt, and every policy in a mixed batch, against the AR greedy output of the same
    arithmetic. (On a CPU without AVX512_BF16 the bf16 dot is emulated and this test costs ~1 min.)"""
    _, prompts, _ = real
    llm = LLM("smollm2-135m", backend="native", compute_dtype="bfloat16", kv_cache_dtype="bfloat16",
              engine_config=EngineConfig(
        max_num_seqs=8, max_model_len=1024, cost_table=flat_cost_table()))
    ar = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, policy="ar"))]
    for policy, block in [("linearspec", 4), ("recguide", None)]:
        outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, policy=policy, block_size=block))
        _check(outs, ar, f"bf16 compute {policy}/{block}")
    mix = [SamplingParams(max_tokens=MAX_TOKENS, policy=p, block_size=b) for p, b in [("ar", None), *POLICIES]]
    _check(llm.generate(prompts, mix[:len(prompts)]), ar, "bf16 compute mixed batch")
