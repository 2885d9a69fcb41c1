"""OpenVINO GenAI on the optimum-intel fp32 export: ``LLMPipeline`` (serial) and
``ContinuousBatchingPipeline`` (batch), optionally with its prompt-lookup speculation."""

from __future__ import annotations

from .base import models_dir, special_ids, threads, versions


class OpenVINOGenAI:
    """f32 inference and f32 KV cache (the CPU plugin's defaults would run bf16 on AVX-512 machines).

    ``prompt_lookup`` > 0: both pipelines built with ``prompt_lookup=True``, that many draft tokens a step
    (``num_assistant_tokens``) found by matching up to ``ngram`` tokens (``max_ngram_size``)."""

    def __init__(self, model_dir: str | None = None, cache_gib: int = 2, prompt_lookup: int = 0,
                 ngram: int = 3, precision: str = "float32") -> None:
        import openvino_genai as ov_genai

        self.g = ov_genai
        self.prompt_lookup, self.ngram = prompt_lookup, ngram
        path = model_dir or str(models_dir() / "ov-llama")
        props = {"INFERENCE_NUM_THREADS": threads()}
        if precision != "default":
            props.update(INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32")
        if prompt_lookup:
            props["prompt_lookup"] = True
        self.pipe = ov_genai.LLMPipeline(path, "CPU", **props)
        sc = ov_genai.SchedulerConfig()
        sc.cache_size, sc.max_num_seqs, sc.max_num_batched_tokens = cache_gib, 64, 4096
        self.cb = ov_genai.ContinuousBatchingPipeline(path, sc, "CPU", props)
        self.eos = special_ids()["eos"]
        self.info = {"versions": versions("openvino-genai", "openvino")}

    def _config(self, max_tokens: int):
        c = self.g.GenerationConfig()
        c.max_new_tokens, c.do_sample, c.ignore_eos, c.eos_token_id = max_tokens, False, True, self.eos
        if self.prompt_lookup:
            c.num_assistant_tokens, c.max_ngram_size = self.prompt_lookup, self.ngram
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
