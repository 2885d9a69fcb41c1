"""OpenVINO GenAI on the optimum-intel fp32 export: ``LLMPipeline`` (serial) and
``ContinuousBatchingPipeline`` (batch)."""

from __future__ import annotations

from .base import EOS_ID, peers_dir, threads, versions


class OpenVINOGenAI:
    """f32 inference and f32 KV cache (the CPU plugin's defaults would run bf16 on AVX-512 machines)."""

    def __init__(self, model_dir: str | None = None, cache_gib: int = 2) -> None:
        import openvino_genai as ov_genai

        self.g = ov_genai
        path = model_dir or str(peers_dir() / "ov-llama")
        props = {"INFERENCE_NUM_THREADS": threads(), "INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
        self.pipe = ov_genai.LLMPipeline(path, "CPU", **props)
        sc = ov_genai.SchedulerConfig()
        sc.cache_size, sc.max_num_seqs, sc.max_num_batched_tokens = cache_gib, 64, 4096
        self.cb = ov_genai.ContinuousBatchingPipeline(path, sc, "CPU", props)
        self.info = {"versions": versions("openvino-genai", "openvino")}

    def _config(self, max_tokens: int):
        c = self.g.GenerationConfig()
        c.max_new_tokens, c.do_sample, c.ignore_eos, c.eos_token_id = max_tokens, False, True, EOS_ID
        return c

    def serial(self, prompts: list[list[int]], max_tokens: int, **_) -> list[list[int]]:
        import numpy as np
        import openvino as ov

        cfg = self._config(max_tokens)
        return [[int(t) for t in self.pipe.generate(ov.Tensor(np.array([p], dtype=np.int64)), cfg).tokens[0]]
                for p in prompts]

    def batch(self, prompts: list[list[int]], max_tokens: int, **_) -> list[list[int]]:
        import numpy as np
        import openvino as ov

        ids = [ov.Tensor(np.array([p], dtype=np.int64)) for p in prompts]
        res = self.cb.generate(ids, [self._config(max_tokens)] * len(prompts))
        return [[int(t) for t in r.m_generation_ids[0]] for r in res]
