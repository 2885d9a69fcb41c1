"""CTranslate2 ``Generator`` on the converted model (float32, 2 intra-op threads)."""

from __future__ import annotations

import json

from .base import models_dir, one_at_a_time, special_ids, threads, versions


class CTranslate2:
    """Token-string API: ids are mapped through the vocabulary of the converted ``tokenizer.json``.

    EOS is ignored by naming the model's ``<mask>`` (never emitted) as the end token; with
    ``include_prompt_in_result=False`` ``max_length`` counts new tokens only.
    """

    def __init__(self, model_dir: str | None = None, compute_type: str = "float32", precision: str = "float32") -> None:
        import ctranslate2

        root = models_dir()
        self.gen = ctranslate2.Generator(model_dir or str(root / "ct2-llama"), device="cpu",
                                         compute_type="default" if precision == "default" else compute_type, intra_threads=threads(), inter_threads=1)
        vocab = json.loads((root / "hf-llama" / "tokenizer.json").read_text())["model"]["vocab"]
        self.tok2id: dict[str, int] = vocab
        self.id2tok = {i: t for t, i in vocab.items()}
        self.end = self.id2tok[special_ids()["mask"]]
        self.info = {"versions": versions("ctranslate2")}

    def batch(self, prompts: list[list[int]], max_tokens: int, **_) -> list[list[int]]:
        toks = [[self.id2tok[i] for i in p] for p in prompts]
        res = self.gen.generate_batch(toks, max_length=max_tokens, sampling_topk=1,
                                      beam_size=1, include_prompt_in_result=False, max_batch_size=64,
                                      end_token=self.end, return_end_token=True)
        return [[self.tok2id[t] for t in r.sequences[0]] for r in res]

    def serial(self, prompts: list[list[int]], max_tokens: int, **knobs) -> list[list[int]]:
        return one_at_a_time(self.batch, prompts, max_tokens, **knobs)
