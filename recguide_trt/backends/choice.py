"""Which backends exist and which one ``LLM()`` picks when none is named.

Kept free of heavy imports: the CLI builds its ``--backend`` choices from here.
"""

from __future__ import annotations

import logging

BACKENDS = ("native", "torch", "onnxruntime", "tensorrt")
"""Every backend name ``LLM(backend=...)`` accepts."""

COMPUTE_DTYPES = ("float32", "bfloat16")
"""The native backend's arithmetic for the projections and the head (``LLM(compute_dtype=...)``)."""
KV_CACHE_DTYPES = ("float32", "bfloat16")
"""The native backend's KV-cache storage (``LLM(kv_cache_dtype=...)``)."""
KV_CACHE_DTYPE_HELP = ("native backend: the KV cache's storage (bfloat16: keys and values rounded to bf16 when "
                       "computed, half the bytes per token; default float32)")
COMPUTE_DTYPE_HELP = ("native backend: the projections' and the head's arithmetic (bfloat16: bf16 dot products "
                      "into float32 sums, AVX512_BF16; default float32)")

log = logging.getLogger("recguide_trt")


def default_backend(device: str = "cpu", dtype: object = None) -> str:
    """The fastest lossless backend for ``device`` / ``dtype``.

    On the CPU in float32 that is ``native`` (the whole forward in one compiled call; see the
    README's peer benchmark), built on first use; if it cannot be built here (no C++ compiler or
    ninja) the eager ``torch`` backend serves instead, with a warning saying why. Other devices and
    dtypes run on ``torch``.
    """
    if str(device) != "cpu" or str(dtype) not in ("None", "float32", "torch.float32"):
        return "torch"
    from .native.build import NativeBuildError, load_native

    try:
        load_native()
    except NativeBuildError as exc:
        log.warning("%s; using backend='torch'", exc)
        return "torch"
    return "native"
