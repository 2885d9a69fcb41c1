"""ONNX Runtime GenAI on the model builder's fp32 CPU export (static, left-padded batches)."""

from __future__ import annotations

import json
from pathlib import Path

from .base import left_pad, models_dir, one_at_a_time, versions

MAX_ROWS = 32
"""The builder's export accepts at most 32 rows ("batch_size (64) must be in [1, 32]"): a larger
batch runs as consecutive generators of 32."""


class OrtGenAI:
    """The ``ortg-fp32-noeos`` copy of the export names the model's ``<mask>`` (never emitted) as EOS, so every
    row decodes ``max_tokens`` tokens; its ``genai_config.json`` sets 2 intra-op threads. Batches are
    left-padded with that config's ``pad_token_id`` (ORT GenAI masks every occurrence of it).

    ``prompt_lookup`` > 0: its n-gram speculation (``set_speculative_options``), that many draft tokens
    a step (``max_draft_tokens``) from a match of ``ngram`` tokens (``ngram_size``); batch-1 only in this
    release ("N-gram decoding requires batch_size=1"), so its batch call runs the prompts one at a time."""

    def __init__(self, model_dir: str | None = None, prompt_lookup: int = 0, ngram: int = 3) -> None:
        import onnxruntime_genai as og

        self.og = og
        self.spec = {"ngram_size": ngram, "max_draft_tokens": prompt_lookup} if prompt_lookup else {}
        path = Path(model_dir or models_dir() / "ortg-fp32-noeos")
        self.model = og.Model(og.Config(str(path)))
        self.pad = json.loads((path / "genai_config.json").read_text())["model"]["pad_token_id"]
        self.info = {"versions": versions("onnxruntime-genai", "onnxruntime")}

    def _generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        import numpy as np

        og = self.og
        ids, _, width = left_pad(prompts, self.pad)
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=width + max_tokens, do_sample=False, batch_size=len(prompts))
        if self.spec:
            params.set_speculative_options(**self.spec)
        gen = og.Generator(self.model, params)
        gen.append_tokens(np.asarray(ids, dtype=np.int32))
        while not gen.is_done():
            gen.generate_next_token()
        return [[int(t) for t in gen.get_sequence(i)][width:] for i in range(len(prompts))]

    def batch(self, prompts: list[list[int]], max_tokens: int, **_) -> list[list[int]]:
        if self.spec:
            return [self._generate([p], max_tokens)[0] for p in prompts]
        out: list[list[int]] = []
        for i in range(0, len(prompts), MAX_ROWS):
            out += self._generate(prompts[i:i + MAX_ROWS], max_tokens)
        return out

    def serial(self, prompts: list[list[int]], max_tokens: int, **knobs) -> list[list[int]]:
        return one_at_a_time(self.batch, prompts, max_tokens, **knobs)
