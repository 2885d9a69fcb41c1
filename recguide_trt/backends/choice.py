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


def check_native_dtypes(compute_dtype: str | None, kv_cache_dtype: str | None, *, allow_none: bool = True) -> None:
    """A ValueError naming the field when ``compute_dtype`` / ``kv_cache_dtype`` is none of its choices
    (``None``: the default, float32, accepted unless ``allow_none`` is false)."""
    for name, value, choices in (("compute_dtype", compute_dtype, COMPUTE_DTYPES),
                                 ("kv_cache_dtype", kv_cache_dtype, KV_CACHE_DTYPES)):
        if (value is not None or not allow_none) and value not in choices:
            raise ValueError(f"{name}={value!r}: choose one of {', '.join(choices)}")


def check_native_dtypes_backend(backend: str, compute_dtype: str | None, kv_cache_dtype: str | None) -> None:
    """A ValueError when a native-only dtype option other than float32 is asked of another backend."""
    for name, value in (("compute_dtype", compute_dtype), ("kv_cache_dtype", kv_cache_dtype)):
        if value not in (None, "float32") and backend != "native":
            raise ValueError(f"{name}={value!r} is the native backend's option (backend={backend!r}): "
                             f"use backend='native', or dtype='bfloat16' for the torch backend")


def add_native_dtype_args(parser) -> None:
    """``--compute-dtype`` / ``--kv-cache-dtype`` on an argparse parser or argument group (default None:
    ``LLM``'s float32)."""
    parser.add_argument("--compute-dtype", default=None, choices=COMPUTE_DTYPES, help=COMPUTE_DTYPE_HELP)
    parser.add_argument("--kv-cache-dtype", default=None, choices=KV_CACHE_DTYPES, help=KV_CACHE_DTYPE_HELP)


def default_backend(device: str = "cpu", dtype: object = None) -> str:
    """The fastest lossless backend for ``device`` / ``dtype``.

    On the CPU in float32 that is ``native`` (the whole forward in one compiled call; see the
    the peer benchmark in docs/engine.md), built on first use; if it cannot be built here (no C++ compiler or
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
