"""llama.cpp through llama-cpp-python's low-level API: the F32 GGUF, greedy argmax on the logits.

The high-level ``Llama`` object decodes one sequence at a time; the low-level ``llama_batch`` lets
``batch`` put every prompt in one decode per step as its own sequence (llama.cpp's own
multi-sequence batching, unified KV cache), which is what a llama.cpp server does.

With ``prompt_lookup`` > 0 the row is llama-cpp-python's own speculation instead: the high-level ``Llama``
with ``draft_model=LlamaPromptLookupDecoding(num_pred_tokens=prompt_lookup, max_ngram_size=ngram)``,
greedy ``generate`` (which never stops at EOS), one sequence at a time in both calls.
"""

from __future__ import annotations

from .base import GGUF_NAMES, models_dir, threads, versions


class LlamaCpp:
    """``n_seq_max`` = 64 sequences of one context; prompts are fed in ``n_batch`` chunks."""

    def __init__(self, gguf: str | None = None, n_ctx: int = 65536, n_batch: int = 2048, prompt_lookup: int = 0,
                 ngram: int = 2) -> None:
        import llama_cpp
        import numpy as np

        self.lib, self.np = llama_cpp, np
        found = [models_dir() / n for n in GGUF_NAMES if (models_dir() / n).is_file()]
        path = gguf or str((found or [models_dir() / GGUF_NAMES[0]])[0])
        self.info = {"versions": versions("llama_cpp_python")}
        self.spec = None
        if prompt_lookup:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            # logits_all: the draft's verification reads every drafted position's logits (without it
            # llama-cpp-python 0.3 keeps one row: "could not broadcast ... into shape (0,)").
            self.spec = llama_cpp.Llama(path, n_ctx=4096, n_batch=512, n_threads=threads(),
                                        n_threads_batch=threads(), verbose=False, logits_all=True,
                                        draft_model=LlamaPromptLookupDecoding(num_pred_tokens=prompt_lookup,
                                                                              max_ngram_size=ngram))
            return
        llama_cpp.llama_backend_init()
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, n_batch, 512, 64
        cp.n_threads = cp.n_threads_batch = threads()
        if hasattr(cp, "kv_unified"):  # one KV pool shared by all sequences (newer llama.cpp)
            cp.kv_unified = True
        self.ctx = llama_cpp.llama_init_from_model(self.model, cp)
        self.n_batch = n_batch
        self.n_vocab = (llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
                        if hasattr(llama_cpp, "llama_vocab_n_tokens") else llama_cpp.llama_n_vocab(self.model))
        self.buf = llama_cpp.llama_batch_init(n_batch, 0, 64)

    def _clear(self) -> None:
        lib = self.lib
        if hasattr(lib, "llama_get_memory"):  # the memory API replaced llama_kv_self_* in 2025
            lib.llama_memory_clear(lib.llama_get_memory(self.ctx), True)
        else:
            lib.llama_kv_self_clear(self.ctx)

    def _decode(self, items: list[tuple[int, int, int, bool]]) -> list[int]:
        """``items``: (token, position, sequence, wants logits); the argmax of each that wants them."""
        lib, np, b = self.lib, self.np, self.buf
        out = []
        for start in range(0, len(items), self.n_batch):
            chunk = items[start:start + self.n_batch]
            b.n_tokens = len(chunk)
            for j, (tok, pos, seq, want) in enumerate(chunk):
                b.token[j], b.pos[j], b.n_seq_id[j] = tok, pos, 1
                b.seq_id[j][0] = seq
                b.logits[j] = want
            rc = lib.llama_decode(self.ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            for j, (_, _, _, want) in enumerate(chunk):
                if want:
                    row = np.ctypeslib.as_array(lib.llama_get_logits_ith(self.ctx, j), shape=(self.n_vocab,))
                    out.append(int(row.argmax()))
        return out

    def _lookup(self, prompt: list[int], max_tokens: int) -> list[int]:
        """One prompt through the prompt-lookup ``Llama``: greedy, exactly ``max_tokens`` tokens."""
        out: list[int] = []
        for t in self.spec.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                    reset=True):
            out.append(int(t))
            if len(out) == max_tokens:
                break
        return out

    def batch(self, prompts: list[list[int]], max_tokens: int, **_) -> list[list[int]]:
        if self.spec is not None:
            return [self._lookup(p, max_tokens) for p in prompts]
        self._clear()
        prefill = [(t, i, s, i == len(p) - 1) for s, p in enumerate(prompts) for i, t in enumerate(p)]
        outs = [[t] for t in self._decode(prefill)]
        for _ in range(max_tokens - 1):
            step = [(o[-1], len(p) + len(o) - 1, s, True) for s, (p, o) in enumerate(zip(prompts, outs))]
            for o, t in zip(outs, self._decode(step)):
                o.append(t)
        return outs

    def serial(self, prompts: list[list[int]], max_tokens: int, **_) -> list[list[int]]:
        return [self.batch([p], max_tokens)[0] for p in prompts]
