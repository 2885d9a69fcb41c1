"""End to end on ONNX Runtime: LinearSpec and RecGuide equal the torch backend's AR greedy output."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from recguide_trt import LLM, EngineConfig, SamplingParams  # noqa: E402
from recguide_trt.runtime.policies.recguide import RecGuideConfig  # noqa: E402
from tests.runtime.helpers import assert_lossless, flat_cost_table  # noqa: E402


@pytest.fixture(scope="module")
def llms(random_ckpt, tmp_path_factory):
    cache = tmp_path_factory.mktemp("onnx-cache")

    def make(backend, **kw):
        ec = EngineConfig(max_num_seqs=16, max_model_len=128, max_block_size=8, cost_table=flat_cost_table(),
                          recguide=RecGuideConfig(switch_concurrency=4))
        return LLM(random_ckpt, backend=backend, engine_config=ec, **kw)

    return make("torch"), make("onnxruntime", cache_dir=cache)


@pytest.mark.parametrize("policy,block", [("linearspec", 4), ("recguide", None)])
@pytest.mark.parametrize("concurrency", [1, 16])
def test_onnxruntime_matches_torch_ar_greedy(llms, policy, block, concurrency):
    torch_llm, ort_llm = llms
    rng = np.random.default_rng(concurrency)
    prompts = [[int(x) for x in rng.integers(4, 96, size=int(rng.integers(2, 30)))] for _ in range(16)]
    ref = [o.token_ids for o in torch_llm.generate(prompts, SamplingParams(max_tokens=16, policy="ar"))]
    got = []
    for i in range(0, len(prompts), concurrency):
        got += [o.token_ids for o in ort_llm.generate(prompts[i:i + concurrency],
                                                      SamplingParams(max_tokens=16, policy=policy,
                                                                     block_size=block))]
    assert_lossless(got, ref, what=f"onnxruntime {policy} C={concurrency}")


def test_out_of_profile_requests_are_rejected_before_running(llms):
    _, ort_llm = llms
    with pytest.raises(ValueError, match="max_block_size 8"):
        ort_llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, block_size=16))
    with pytest.raises(ValueError, match="context window"):
        ort_llm.generate([[5] * 200], SamplingParams(max_tokens=4))



def test_prefix_cache_hits_on_onnxruntime_are_lossless(llms):
    """The prefix cache on ONNX Runtime, a compacting backend (prefixes are copied between slots with its
    copy_slot, and its prefill profile takes a past). Six prompts sharing a 24-token prefix: one at a time,
    each reuses the prefix its predecessor left in slot 0; the last one again finds itself whole (all but its
    last token); in one batch, each copies the prefix from the request admitted before it. Every answer equals
    the torch backend's AR greedy one."""
    torch_llm, ort_llm = llms
    assert ort_llm.engine._compacts and ort_llm.engine.config.prefix_cache
    rng = np.random.default_rng(7)
    shared = [int(x) for x in rng.integers(4, 96, size=24)]
    prompts = [shared + [int(x) for x in rng.integers(4, 96, size=int(rng.integers(1, 12)))] for _ in range(6)]
    ref = [o.token_ids for o in torch_llm.generate(prompts, SamplingParams(max_tokens=12, policy="ar"))]
    params = [SamplingParams(max_tokens=12, policy=p, block_size=b)
              for p, b in [("ar", None), ("linearspec", 4), ("recguide", None)] * 2]
    one_by_one = [ort_llm.generate([p], q)[0] for p, q in zip(prompts, params)]
    repeat = ort_llm.generate(prompts[-1:], params[-1:])
    batch = ort_llm.generate(prompts, params)
    assert [o.metrics.cached_prompt_tokens >= len(shared) for o in one_by_one + batch] == [False] + [True] * 11, \
        [o.metrics.cached_prompt_tokens for o in one_by_one + batch]
    assert repeat[0].metrics.cached_prompt_tokens == len(prompts[-1]) - 1
    for name, outs, refs in (("one by one", one_by_one, ref), ("repeat", repeat, ref[-1:]), ("batch", batch, ref)):
        assert all(o.error is None for o in outs)
        assert_lossless([o.token_ids for o in outs], refs, what=f"onnxruntime prefix cache, {name}")
