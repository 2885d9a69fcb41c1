"""Training a draft adapter for a frozen model (``recguide train-drafter``): the loss, the data, the loop.

The names load on first use (PEP 562), so that :mod:`.config` (the settings and the command line) imports
without torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {name: ".distill" for name in ("Drafts", "accepted_drafts", "distill_loss", "draft_logits", "draft_loss",
                                          "frozen_context", "position_weights")}
_EXPORTS.update({"LossConfig": ".config", "DrafterConfig": ".config"})

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from .config import DrafterConfig, LossConfig
    from .distill import (
        Drafts,
        accepted_drafts,
        distill_loss,
        draft_logits,
        draft_loss,
        frozen_context,
        position_weights,
    )

__all__ = ["Drafts", "DrafterConfig", "LossConfig", "accepted_drafts", "distill_loss", "draft_logits", "draft_loss",
           "frozen_context", "position_weights"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
