"""The serving core: continuous batching under random arrivals, admission, cancellation, isolation."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from recguide_trt import LLM, EngineConfig, SamplingParams
from recguide_trt.runtime.request import Status

from .fake_backend import reference
from .helpers import assert_lossless, fake_engine, flat_cost_table

POLICIES = [("ar", None), ("linearspec", 4), ("linearspec", 8), ("recguide", None)]


def _prompts(n, vocab, seed, max_len=30):
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(4, vocab, size=int(rng.integers(1, max_len)))] for _ in range(n)]


def drive_random_arrivals(engine, prompts, params_for, concurrency, seed, cancel_every=0):
    """Submit prompts at random steps keeping at most ``concurrency`` in flight; cancel some mid-flight."""
    rng = np.random.default_rng(seed)
    pending = list(enumerate(prompts))
    live, reqs, cancelled = [], {}, set()
    while pending or engine.has_work():
        while pending and len([r for r in live if not r.done]) < concurrency and rng.random() < 0.7:
            i, p = pending.pop(0)
            reqs[i] = engine.submit(p, params_for(i))
            live.append(reqs[i])
        engine.step()
        if cancel_every:
            running = [r for r in engine.running if r.output_ids and r.id % cancel_every == 0
                       and r.id not in cancelled]
            for r in running[:1]:
                engine.cancel(r.id)
                cancelled.add(r.id)
        live = [r for r in live if not r.done]
    return [reqs[i] for i in range(len(prompts))], cancelled


@pytest.mark.parametrize("concurrency", [1, 4, 16, 64])
def test_lossless_under_random_arrivals_with_cancellations(concurrency):
    engine = fake_engine(max_num_seqs=64)
    prompts = _prompts(120, 60, seed=concurrency)
    reqs, cancelled = drive_random_arrivals(
        engine, prompts, lambda i: SamplingParams(max_tokens=32, policy=POLICIES[i % 4][0],
                                                  block_size=POLICIES[i % 4][1]),
        concurrency, seed=concurrency, cancel_every=7)
    assert cancelled
    kept = [i for i, r in enumerate(reqs) if r.id not in cancelled]
    assert all(reqs[i].status is Status.FINISHED for i in kept)
    assert all(reqs[i].status is Status.CANCELLED for i, r in enumerate(reqs) if r.id in cancelled)
    assert_lossless([reqs[i].output_ids for i in kept], [reference(prompts[i], 32) for i in kept],
                    what=f"C={concurrency}")
    assert max(engine.concurrency_hist) <= concurrency
    assert sorted(engine._free_slots) == list(range(64)) and engine._reserved == 0


def test_real_model_random_arrivals_keep_cache_consistent(random_ckpt):
    """Slots are compacted as requests leave: outputs still equal AR greedy on a real backbone."""
    from recguide_trt.runtime.reference import reference_greedy

    llm = LLM(random_ckpt, engine_config=EngineConfig(max_num_seqs=16, max_model_len=128,
                                                      cost_table=flat_cost_table()))
    prompts = _prompts(100, 96, seed=5, max_len=24)
    refs = [reference_greedy(llm.checkpoint.model, p, 8, 2) for p in prompts]
    for concurrency in (4, 16):
        reqs, cancelled = drive_random_arrivals(
            llm.engine, prompts, lambda i: SamplingParams(max_tokens=8, policy=POLICIES[i % 4][0],
                                                          block_size=POLICIES[i % 4][1]),
            concurrency, seed=concurrency, cancel_every=9)
        kept = [i for i, r in enumerate(reqs) if r.id not in cancelled]
        assert_lossless([reqs[i].output_ids for i in kept], [refs[i][0] for i in kept], [refs[i][1] for i in kept],
                        what=f"real C={concurrency}")


def test_admission_waits_for_kv_budget_and_loses_nothing():
    # Each request reserves prompt (20) + max_tokens (40) + scratch (32) tokens; the budget fits three.
    engine = fake_engine(max_num_seqs=16, kv_budget_tokens=3 * (20 + 40 + 32))
    rng = np.random.default_rng(9)
    prompts = [[int(x) for x in rng.integers(4, 60, size=20)] for _ in range(40)]
    reqs = [engine.submit(p, SamplingParams(max_tokens=40, policy="recguide")) for p in prompts]
    engine.run_until_done()
    assert max(engine.concurrency_hist) == 3
    assert all(r.status is Status.FINISHED for r in reqs)
    assert_lossless([r.output_ids for r in reqs], [reference(p, 40) for p in prompts], what="admission")


def test_request_larger_than_budget_fails_cleanly():
    engine = fake_engine(max_num_seqs=4, kv_budget_tokens=50)
    r = engine.submit([5, 6, 7], SamplingParams(max_tokens=40))
    engine.run_until_done()
    assert r.status is Status.FAILED and "budget" in r.error
    assert not engine.has_work()


def test_exception_in_one_request_fails_only_that_request(monkeypatch):
    engine = fake_engine(max_num_seqs=8)
    prompts = _prompts(8, 60, seed=2)
    reqs = [engine.submit(p, SamplingParams(max_tokens=30, policy="linearspec", block_size=4)) for p in prompts]
    victim = reqs[3].id
    original = engine.executor._decide_row

    def faulty(b, w, r, out, c):
        if r.id == victim and r.output_ids:
            raise RuntimeError("injected acceptance failure")
        return original(b, w, r, out, c)

    monkeypatch.setattr(engine.executor, "_decide_row", faulty)
    engine.run_until_done()
    assert reqs[3].status is Status.FAILED and "injected acceptance failure" in reqs[3].error
    others = [i for i in range(8) if i != 3]
    assert all(reqs[i].status is Status.FINISHED for i in others)
    assert_lossless([reqs[i].output_ids for i in others], [reference(prompts[i], 30) for i in others])


def test_submit_rejects_bad_params_naming_the_field():
    engine = fake_engine()
    with pytest.raises(ValueError, match="top_p"):
        engine.submit([5, 6], SamplingParams(top_p=2.0))
    with pytest.raises(ValueError, match="policy"):
        engine.submit([5, 6], SamplingParams(policy="nope"))
    assert not engine.has_work()


def test_streaming_handles_thread_and_asyncio(random_ckpt):
    llm = LLM(random_ckpt, engine_config=EngineConfig(max_num_seqs=8, max_model_len=128,
                                                      cost_table=flat_cost_table()))
    prompts = _prompts(6, 96, seed=4)
    params = SamplingParams(max_tokens=16, policy="recguide")
    expected = [o.token_ids for o in llm.generate(prompts, params)]
    handles = [llm.submit(p, params) for p in prompts]
    streamed = [[t for chunk in h for t in chunk] for h in handles]
    assert streamed == expected

    async def consume():
        hs = [llm.submit(p, params) for p in prompts]
        out = []
        for h in hs:
            toks = []
            async for chunk in h:
                toks.extend(chunk)
            out.append(toks)
        return out

    assert asyncio.run(consume()) == expected
    # Cancel a long request mid-stream: it ends, and the engine keeps serving.
    h = llm.submit(prompts[0], SamplingParams(max_tokens=100, policy="linearspec", block_size=4))
    first = next(iter(h))
    assert first
    h.cancel()
    req = h.result(timeout=30)
    assert req.finish_reason == "cancelled" and len(req.output_ids) < 100
    assert llm.generate(prompts[:2], params)[0].token_ids == expected[0]
    llm.shutdown()


def test_lean_step_overhead_is_reported():
    engine = fake_engine(max_num_seqs=16)
    for p in _prompts(16, 60, seed=1):
        engine.submit(p, SamplingParams(max_tokens=16))
    engine.run_until_done()
    stats = engine.stats()
    assert 0 <= stats["overhead_share"] <= 1 and stats["steps"] > 0
    assert stats["blocks_by_concurrency"]


def test_cost_table_is_measured_at_the_configured_prefix(random_ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("RECGUIDE_CACHE", str(tmp_path))
    for past in (128, 40):
        llm = LLM(random_ckpt, engine_config=EngineConfig(max_num_seqs=2, max_model_len=256, cost_past_len=past))
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2, policy="recguide"))
        assert llm.engine.policies["recguide"].cost.meta["past_len"] == past
    with pytest.raises(ValueError, match="cost_past_len"):
        LLM(random_ckpt, engine_config=EngineConfig(cost_past_len=0))
