"""The NLD backbone: config, PyTorch model, masks, checkpoint and tokenizer loading.

The names load on first use (PEP 562): the config and the masks import without torch, so a command that
only reads a config or fails on bad input does not wait for it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

_EXPORTS = {"NLDModel": ".backbone", "Checkpoint": ".checkpoint", "load_checkpoint": ".checkpoint",
            "save_checkpoint": ".checkpoint", "NLDConfig": ".config", "RopeConfig": ".config",
            "Tokenizer": ".tokenizer"}

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from .backbone import NLDModel
    from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
    from .config import NLDConfig, RopeConfig
    from .tokenizer import Tokenizer

__all__ = ["Checkpoint", "NLDConfig", "NLDModel", "RopeConfig", "Tokenizer", "load_checkpoint", "save_checkpoint"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
