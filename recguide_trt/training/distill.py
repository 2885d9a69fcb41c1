"""The draft adapter's self-distillation loss: one definition for every model we train a drafter for.

The base model is frozen; the adapter (gated LoRA, the draft MASK embedding) acts on draft-mode
tokens only. A training example is the model's own greedy continuation of a prompt; every block of
the continuation becomes one drafting problem exactly as at inference: ``[seed, MASK × (L-1)]``
seeing the frozen AR cache up to its seed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model import masks as M
from ..model.backbone import NLDModel


def position_weights(block: int, first: float = 1.0, last: float = 0.5) -> torch.Tensor:
    """Weights of draft positions 2 … L-1: earlier positions matter more, acceptance stops at the first miss."""
    return torch.linspace(first, last, block - 2)


def draft_logits(model: NLDModel, seq: torch.Tensor, prompt_len: int, block: int,
                 offset: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every block of the continuation drafted as at inference, in one forward.

    ``seq``: ``[B, T]`` token ids, prompt (``prompt_len`` tokens) then the greedy continuation;
    blocks start at ``prompt_len + offset`` and every ``block`` tokens after. Each block is
    ``[seed, MASK × (L-1)]`` seeing the frozen AR cache up to its seed (computed without
    gradients). The seed runs causally with the adapter off (``draft_seed_causal``: its logits are
    the AR prediction of d1, exact by construction), so only draft positions 2 … L-1 are returned:
    logits ``[B·n, L-2, V]``, targets ``[B·n, L-2]`` and ``alive`` ``[B·n, L-2]`` (False after the
    continuation's first EOS).
    """
    cfg = model.config
    mask_id, eos_id = cfg.mask_token_id, cfg.eos_token_id
    B, T = seq.shape
    with torch.no_grad():
        pos = torch.arange(T).expand(B, T)
        _, kv = model(seq, pos, torch.from_numpy(M.causal(T)).expand(B, T, T))
    starts = list(range(prompt_len + offset, T - block + 1, block))
    n = len(starts)
    if n == 0:
        raise ValueError(f"a sequence of {T} tokens with a {prompt_len}-token prompt has no block of {block}")
    # All blocks of the continuation as one batch of draft forwards: block j sees the cache up to its seed.
    ids = torch.full((B, n, block), mask_id, dtype=seq.dtype)
    for j, s in enumerate(starts):
        ids[:, j, 0] = seq[:, s]
    targets = torch.stack([seq[:, s:s + block] for s in starts], 1).reshape(B * n, block)[:, 2:]
    ids = ids.view(B * n, block)
    pos = torch.stack([torch.arange(s, s + block) for s in starts]).repeat(B, 1)
    past = [(k.repeat_interleave(n, 0), v.repeat_interleave(n, 0)) for k, v in kv]
    visible = torch.zeros(n, T, dtype=torch.bool)
    for j, s in enumerate(starts):
        visible[j, :s] = True
    intra = torch.from_numpy(M.draft_block(block, seed_causal=True))
    mask = torch.cat([visible.repeat(B, 1)[:, None, :].expand(-1, block, -1),
                      intra.expand(B * n, block, block)], dim=-1)
    gate = torch.from_numpy(M.draft_gate(block, seed_causal=True)).expand(B * n, block)
    # The head runs on the scored positions only (it is a fifth of a small model's weights).
    wanted = torch.arange(2, block).expand(B * n, block - 2)
    logits, _ = model(ids, pos, mask, past_kv=past, draft_gate=gate, logit_index=wanted)
    is_eos = (seq == eos_id).long()
    eos_before = torch.cumsum(is_eos, dim=1) - is_eos  # EOS strictly before t
    alive = (eos_before - eos_before[:, prompt_len:prompt_len + 1]) == 0
    alive = torch.stack([alive[:, s + 2:s + block] for s in starts], 1).reshape(B * n, block - 2)
    return logits, targets, alive


def weighted_ce(logits: torch.Tensor, targets: torch.Tensor, alive: torch.Tensor,
                weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy over live draft positions, weighted per position (default :func:`position_weights`)."""
    rows, width = targets.shape
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                         reduction="none").view(rows, width)
    w = (position_weights(width + 2) if weights is None else weights).to(ce.dtype).expand(rows, width)
    w = w * alive.to(ce.dtype)
    return (ce * w).sum() / w.sum().clamp(min=1.0)


def accepted_drafts(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per block, how many of draft positions 2 … L-1 greedy verification would accept (leading hits).

    A block's tokens per round are then ``2 + accepted``: d1 (the seed's AR prediction, always
    right) and the verifier's bonus token; its mean is the teacher-forced MAL at that block size.
    """
    hits = (logits.argmax(-1) == targets).long()
    return torch.cumprod(hits, dim=1).sum(1)


def distill_loss(model: NLDModel, seq: torch.Tensor, prompt_len: int, block: int,
                 weights: torch.Tensor | None = None, offset: int = 0) -> torch.Tensor:
    """Self-distillation loss of the draft adapter: :func:`weighted_ce` of :func:`draft_logits`."""
    logits, targets, alive = draft_logits(model, seq, prompt_len, block, offset)
    return weighted_ce(logits, targets, alive, weights)
