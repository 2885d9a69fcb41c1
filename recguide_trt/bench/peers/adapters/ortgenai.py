"""ONNX Runtime GenAI on the model builder's fp32 CPU export (static, left-padded batches)."""

from __future__ import annotations

from .base import left_pad, one_at_a_time, peers_dir, versions

MAX_ROWS = 32
"""The builder's export accepts at most 32 rows ("batch_size (64) must be in [1, 32]"): a larger
batch runs as consecutive generators of 32."""


class OrtGenAI:
    """The ``ortg-fp32-noeos`` copy of the export names ``<mask>`` (never emitted) as EOS, so every
    row decodes ``max_tokens`` tokens; its ``genai_config.json`` sets 2 intra-op threads."""

    def __init__(self, model_dir: str | None = None) -> None:
        import onnxruntime_genai as og

        self.og = og
        self.model = og.Model(og.Config(model_dir or str(peers_dir() / "ortg-fp32-noeos")))
        self.info = {"versions": versions("onnxruntime-genai", "onnxruntime")}

    def _generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        import numpy as np

        og = self.og
        ids, _, width = left_pad(prompts)
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=width + max_tokens, do_sample=False, batch_size=len(prompts))
        gen = og.Generator(self.model, params)
        gen.append_tokens(np.asarray(ids, dtype=np.int32))
        while not gen.is_done():
            gen.generate_next_token()
        return [[int(t) for t in gen.get_sequence(i)][width:] for i in range(len(prompts))]

    def batch(self, prompts: list[list[int]], max_tokens: int, **_) -> list[list[int]]:
        out: list[list[int]] = []
        for i in range(0, len(prompts), MAX_ROWS):
            out += self._generate(prompts[i:i + MAX_ROWS], max_tokens)
        return out

    def serial(self, prompts: list[list[int]], max_tokens: int, **knobs) -> list[list[int]]:
        return one_at_a_time(self.batch, prompts, max_tokens, **knobs)
