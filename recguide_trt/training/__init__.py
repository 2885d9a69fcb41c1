"""Training a draft adapter for a frozen model (``recguide train-drafter``): the loss, the data, the loop.

The names load on first use (PEP 562), so that :mod:`.config` (the settings and the command line) imports
without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
