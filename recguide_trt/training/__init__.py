"""Training a draft adapter for a frozen model (``recguide train-drafter``): the loss, the data, the loop."""

from .distill import (
    Drafts,
    LossConfig,
    accepted_drafts,
    distill_loss,
    draft_logits,
    draft_loss,
    frozen_context,
    position_weights,
)

__all__ = ["Drafts", "LossConfig", "accepted_drafts", "distill_loss", "draft_logits", "draft_loss", "frozen_context",
           "position_weights"]
