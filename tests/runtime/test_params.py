"""Bad input is rejected up front with a ValueError that says what to change."""

from __future__ import annotations

import pytest

from recguide_trt import LLM, EngineConfig, SamplingParams

from .helpers import flat_cost_table


@pytest.fixture(scope="module")
def llm(random_ckpt):
    return LLM(random_ckpt, engine_config=EngineConfig(max_num_seqs=4, max_model_len=128,
                                                       cost_table=flat_cost_table()))


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_tokens=0), "max_tokens must be a positive integer"),
    (dict(max_tokens=-3), "max_tokens must be a positive integer"),
    (dict(max_tokens=2.5), "max_tokens must be a positive integer"),
    (dict(temperature=-0.1), "temperature must be >= 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(policy="eagle"), "unknown policy 'eagle'; choose one of ar, linearspec, recguide"),
    (dict(block_size=1), "block_size must be an integer >= 2"),
    (dict(block_size=0), "block_size must be an integer >= 2"),
])
def test_bad_sampling_params(llm, kwargs, match):
    with pytest.raises(ValueError, match=match):
        llm.generate([[5, 6, 7]], SamplingParams(**kwargs))


def test_bad_prompts(llm):
    with pytest.raises(ValueError, match="prompts is empty"):
        llm.generate([])
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate([[]])
    with pytest.raises(ValueError, match="context window"):
        llm.generate([[5] * 200])
    with pytest.raises(ValueError, match="lower max_tokens"):
        llm.generate([[5] * 100], SamplingParams(max_tokens=100))
    with pytest.raises(ValueError, match=r"token ids must be integers in \[0, 96\)"):
        llm.generate([[5, 1000]])
    with pytest.raises(ValueError, match="no tokenizer.json"):
        llm.generate(["text prompt"])
    with pytest.raises(ValueError, match="exceeds the engine's max_block_size"):
        llm.generate([[5, 6]], SamplingParams(max_tokens=8, block_size=64))


def test_bad_construction(random_ckpt):
    with pytest.raises(ValueError, match="unknown backend 'cuda-graphs'"):
        LLM(random_ckpt, backend="cuda-graphs")
    with pytest.raises(ValueError, match="unknown device"):
        LLM(random_ckpt, device="tpu")
