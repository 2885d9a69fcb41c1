"""RecGuide-TRT itself: ``LLM(model, backend=...)``; knobs: ``policy``, ``block_size``."""

from __future__ import annotations

from .base import threads, versions

BACKEND_KWARGS: dict[str, dict] = {"onnxruntime": {"num_threads": None}}
"""Per-backend constructor options; ``None`` values are filled with the thread count. Backends not
named here get only ``torch.set_num_threads`` and the worker's ``OMP_NUM_THREADS``."""


class Ours:
    """One engine (one backend) serving every policy: the policy is per request, as in production."""

    def __init__(self, backend: str | None = "torch", model: str = "tiny", max_num_seqs: int = 64,
                 compute_dtype: str | None = None, kv_cache_dtype: str | None = None) -> None:
        import torch

        from recguide_trt import LLM

        torch.set_num_threads(threads())
        kwargs = {k: (threads() if v is None else v) for k, v in BACKEND_KWARGS.get(backend or "", {}).items()}
        if backend is not None:  # None: whatever LLM() picks by default
            kwargs["backend"] = backend
        kwargs.update({k: v for k, v in (("compute_dtype", compute_dtype), ("kv_cache_dtype", kv_cache_dtype)) if v})
        # No prefix cache: the bench replays its prompts, and each run must pay its own prefill.
        self.llm = LLM(model, max_num_seqs=max_num_seqs, prefix_cache=False, **kwargs)
        self.info = {"backend": backend or "default", "backend_class": type(self.llm.backend).__name__,
                     "versions": versions("recguide-trt", "torch", "onnxruntime")}

    @staticmethod
    def _params(max_tokens: int, policy: str = "ar", block_size: int | None = None):
        from recguide_trt import SamplingParams

        return SamplingParams(max_tokens=max_tokens, temperature=0.0, policy=policy, block_size=block_size,
                              stop_at_eos=False)

    def serial(self, prompts: list[list[int]], max_tokens: int, **knobs) -> list[list[int]]:
        sp = self._params(max_tokens, **knobs)
        return [self.llm.generate([p], sp)[0].token_ids for p in prompts]

    def batch(self, prompts: list[list[int]], max_tokens: int, **knobs) -> list[list[int]]:
        return [o.token_ids for o in self.llm.generate(prompts, self._params(max_tokens, **knobs))]
