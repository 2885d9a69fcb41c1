"""Engine construction and lossless comparison shared by the runtime tests."""

from __future__ import annotations

import numpy as np

from recguide_trt.model import NLDConfig
from recguide_trt.model.draft_sampler import DraftSamplerWeights
from recguide_trt.runtime.cost_model import CostTable
from recguide_trt.runtime.engine import Engine, EngineConfig
from recguide_trt.runtime.policies.recguide import RecGuideConfig
from recguide_trt.runtime.reference import first_divergence, is_near_tie

from .fake_backend import EOS, MASK, FakeBackend, V


def flat_cost_table() -> CostTable:
    """Cost grows with tokens only mildly: overlap pays at low C, small blocks at high C."""
    batches, tokens = [1, 4, 16, 64], [1, 2, 4, 8, 16, 32]
    secs = [[b ** 0.3 * (1 + 0.02 * b * t / 8) * (1 + 0.01 * t) for t in tokens] for b in batches]
    return CostTable(batches, tokens, secs, {"synthetic": True})


def fake_engine(max_num_seqs: int = 16, recguide: RecGuideConfig | None = None, **kw) -> Engine:
    cfg = NLDConfig(vocab_size=V, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1,
                    num_key_value_heads=1, head_dim=8, max_position_embeddings=4096, mask_token_id=MASK,
                    eos_token_id=EOS, block_size=8)
    ec = EngineConfig(max_num_seqs=max_num_seqs, max_model_len=1024, max_block_size=16,
                      recguide=recguide or RecGuideConfig(), cost_table=flat_cost_table(), **kw)
    return Engine(FakeBackend(max_num_seqs, 1024 + 64), cfg, ec)


def assert_lossless(outputs: list[list[int]], refs: list[list[int]], margins: list[list[float]] | None = None,
                    what: str = "") -> int:
    """Token-identical, except at a reference near-tie (counted and returned, must stay rare)."""
    ties = 0
    for i, (got, ref) in enumerate(zip(outputs, refs)):
        k = first_divergence(got, ref)
        if k is None:
            continue
        if margins is not None and is_near_tie(margins[i], k):
            ties += 1
            continue
        raise AssertionError(f"{what}: prompt {i} diverges at token {k}: got {got[k:k + 5]}, "
                             f"AR greedy {ref[k:k + 5]}")
    assert ties <= max(1, len(refs) // 100), f"{what}: {ties} near-tie divergences in {len(refs)} prompts"
    return ties


def random_weights(rng: np.random.Generator, hidden: int = 16, width: int = 12, offsets: int = 6,
                   scale: float = 1.0) -> DraftSamplerWeights:
    """A draft sampler's weights, random (``scale`` 0: an untrained sampler, which keeps each position's top-1)."""
    def r(*shape):
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    return DraftSamplerWeights(offset=r(offsets, hidden), up_weight=r(width, hidden), up_bias=r(width),
                               down_weight=r(hidden, width), down_bias=r(hidden), repeat=r(offsets))


def covering_prompts(seed: int, count: int, high: int = V) -> list[list[int]]:
    """Prompts holding every token in [4, high) (a permutation) and 8 more: a 1-gram lookup finds a draft for any
    token of that range."""
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.permutation(np.arange(4, high))] + [int(t) for t in rng.integers(4, high, 8)]
            for _ in range(count)]


def run_lossless(engine: Engine, prompts: list[list[int]], policy: str, max_tokens: int, sampled: bool = False):
    """Run ``prompts`` greedy under ``policy`` (plus, with ``sampled``, the first prompt sampled beside them), check
    every greedy output against AR greedy's, and return (greedy requests, the sampled request or None)."""
    from recguide_trt.runtime.params import SamplingParams

    from .fake_backend import reference

    reqs = [engine.submit(p, SamplingParams(max_tokens=max_tokens, policy=policy)) for p in prompts]
    other = (engine.submit(prompts[0], SamplingParams(max_tokens=max_tokens, policy=policy, temperature=0.8, seed=1))
             if sampled else None)
    engine.run_until_done()
    assert all(r.error is None for r in reqs + ([other] if other else []))
    assert_lossless([r.output_ids for r in reqs], [reference(p, max_tokens) for p in prompts], what=policy)
    return reqs, other
