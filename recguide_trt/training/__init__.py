"""Training a draft adapter for a frozen model (``recguide train-drafter``): the loss, the data, the loop."""

from .distill import accepted_drafts, distill_loss, draft_logits, position_weights, weighted_ce

__all__ = ["accepted_drafts", "distill_loss", "draft_logits", "position_weights", "weighted_ce"]
