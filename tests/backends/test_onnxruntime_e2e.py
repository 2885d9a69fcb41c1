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
