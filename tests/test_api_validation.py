"""LLM / SamplingParams input checks and thread safety, as a user calls them."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from recguide_trt import LLM, SamplingParams
from recguide_trt.runtime.engine import EngineConfig
from tests.conftest import has_embedded

pytestmark = pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny")


@pytest.mark.parametrize("kwargs,needle", [
    (dict(max_num_seqs=0), "max_num_seqs must be a positive integer"),
    (dict(max_num_seqs=-1), "max_num_seqs must be a positive integer"),
    (dict(max_num_seqs=2.5), "max_num_seqs must be a positive integer"),
    (dict(max_model_len=0), "max_model_len must be a positive integer"),
    (dict(engine_config=EngineConfig(max_block_size=1)), "max_block_size must be an integer >= 2"),
    (dict(engine_config=EngineConfig(cost_past_len=0)), "cost_past_len must be an integer >= 1"),
    (dict(engine_config=EngineConfig(kv_budget_tokens=-5)), "kv_budget_tokens must be an integer >= 1"),
    (dict(engine_config={"max_num_seqs": 4}), "engine_config must be an EngineConfig"),
    (dict(device="tpu"), "unknown device"),
])
def test_constructor_arguments_are_validated(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        LLM(**kwargs)


def test_numpy_scalars_are_accepted(llm):
    p = SamplingParams(max_tokens=np.int64(3), top_p=np.float32(0.5), temperature=np.float64(0.0), seed=np.int32(7),
                       block_size=np.int16(4), policy="linearspec")
    out = llm.generate("def f():", p)[0]
    assert len(out.token_ids) <= 3 and out.error is None
    assert isinstance(p.top_p, float) and p.top_p == 0.5


@pytest.mark.parametrize("params,needle", [
    (SamplingParams(temperature=float("nan")), "temperature must be a finite number"),
    (SamplingParams(temperature=float("inf")), "temperature must be a finite number"),
    (SamplingParams(top_p=float("nan")), "top_p must be a finite number"),
    (SamplingParams(seed=-1), "seed must be an integer >= 0"),
    (SamplingParams(max_tokens=np.float32(4)), "max_tokens must be a positive integer"),
    ({"max_tokens": 4}, "params must be a SamplingParams"),
    ("greedy", "params must be a SamplingParams"),
])
def test_bad_params_say_what_is_wrong(llm, params, needle):
    with pytest.raises(ValueError, match=needle):
        llm.generate("x", params)


@pytest.mark.parametrize("prompts,needle", [
    (None, "got NoneType"), (5, "got int"), (b"abc", "bytes"), (np.array([5, 6]), "numpy array"),
    ([], "prompts is empty"), ("a\ud800b", "not valid Unicode"), ([{"a": 1}], "got dict"),
])
def test_bad_prompts_say_what_is_wrong(llm, prompts, needle):
    with pytest.raises(ValueError, match=needle):
        llm.generate(prompts, SamplingParams(max_tokens=2))


def test_generate_from_eight_threads_matches_ar(llm):
    prompts = [f"def function_{i}(x):\n    " for i in range(8)]
    policies = ["ar", "linearspec", "recguide", "linearspec"] * 2
    ref = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=12, policy="ar"))]
    got: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        try:
            barrier.wait()
            got[i] = llm.generate(prompts[i], SamplingParams(max_tokens=12, policy=policies[i]))[0].token_ids
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert [got[i] for i in range(8)] == ref
