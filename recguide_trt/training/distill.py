"""The draft adapter's self-distillation loss: one definition for every model we train a drafter for.

The base model is frozen; the adapter (gated LoRA, the draft MASK embedding) acts on draft-mode
tokens only. A training example is the model's own greedy continuation of a prompt; every block of
the continuation becomes one drafting problem exactly as at inference: ``[seed, MASK × (L-1)]``
seeing the frozen AR cache up to its seed.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..model import masks as M
from ..model.backbone import NLDModel
from .config import LossConfig

DEFAULT_LOSS = LossConfig()
"""Plain cross-entropy with the default position weights (the loss of every shipped drafter)."""


def position_weights(block: int, first: float = 1.0, last: float = 0.5) -> torch.Tensor:
    """Weights of draft positions 2 … L-1: earlier positions matter more, acceptance stops at the first miss."""
    return torch.linspace(first, last, block - 2)


class Drafts(NamedTuple):
    """The draft positions 2 … L-1 of every block of a batch of continuations (see :func:`draft_logits`)."""

    logits: torch.Tensor
    """``[B·n, L-2, V]``: the draft forward's logits (with gradients through the adapter)."""
    targets: torch.Tensor
    """``[B·n, L-2]``: the continuation's tokens there (the frozen model's greedy choice)."""
    alive: torch.Tensor
    """``[B·n, L-2]``: False after the continuation's first EOS."""
    teacher: torch.Tensor | None
    """``[B·n, L-2, V]``: the frozen AR logits predicting the same tokens, or None if not asked for."""


class FrozenContext(NamedTuple):
    """The frozen model's causal pass over a batch of sequences: what every block size drafts against."""

    kv: list
    """Per layer ``(k, v)`` of the whole sequence (post-RoPE), computed without gradients."""
    ar_logits: torch.Tensor | None
    """``[B, T - prompt_len, V]``: AR logits at the continuation's positions, or None if not asked for."""


def block_starts(prompt_len: int, seq_len: int, block: int, offset: int = 0) -> list[int]:
    """Seed positions of the draft blocks a sequence's continuation is cut into: one every ``block`` tokens
    from the prompt's end (plus ``offset``), each block wholly inside the sequence."""
    return list(range(prompt_len + offset, seq_len - block + 1, block))


def holds_block(continuation_len: int, block: int) -> bool:
    """Whether a continuation is long enough to train or score blocks of ``block``: ``block + 1`` tokens, the
    block's positions and the one after them."""
    return continuation_len >= block + 1


@torch.no_grad()
def frozen_context(model: NLDModel, seq: torch.Tensor, prompt_len: int, teacher: bool = False) -> FrozenContext:
    """One causal pass of the frozen model over ``seq`` (``[B, T]``), shared by every block size drafted on it.

    The head runs on the continuation only when ``teacher`` (the KL term's soft targets), else on one
    position: on a 135 M model it is a fifth of the FLOPs of a pass over a 320-token prompt.
    """
    B, T = seq.shape
    dev = seq.device  # every index and mask tensor goes where the tokens are (CPU or CUDA)
    pos = torch.arange(T, device=dev).expand(B, T)
    wanted = torch.arange(prompt_len if teacher else T - 1, T, device=dev).expand(B, -1)
    logits, kv = model(seq, pos, torch.from_numpy(M.causal(T)).to(dev).expand(B, T, T), logit_index=wanted)
    return FrozenContext(kv, logits if teacher else None)


def draft_logits(model: NLDModel, seq: torch.Tensor, prompt_len: int, block: int,
                 offset: int = 0, teacher: bool = False, context: FrozenContext | None = None) -> Drafts:
    """Every block of the continuation drafted as at inference, in one forward.

    ``seq``: ``[B, T]`` token ids, prompt (``prompt_len`` tokens) then the greedy continuation;
    blocks start at ``prompt_len + offset`` and every ``block`` tokens after. Each block is
    ``[seed, MASK × (L-1)]`` seeing the frozen AR cache up to its seed (computed without
    gradients). The seed runs causally with the adapter off (``draft_seed_causal``: its logits are
    the AR prediction of d1, exact by construction), so only draft positions 2 … L-1 are returned
    (:class:`Drafts`); ``teacher`` keeps the frozen forward's logits at those positions too.
    ``context``: :func:`frozen_context` of ``seq``, when several block sizes are drafted on it.
    """
    cfg = model.config
    mask_id, eos_ids = cfg.mask_token_id, cfg.eos_token_ids
    B, T = seq.shape
    if context is None:
        context = frozen_context(model, seq, prompt_len, teacher)
    elif teacher and context.ar_logits is None:
        raise ValueError("teacher=True needs a context made with frozen_context(..., teacher=True)")
    kv = context.kv
    starts = block_starts(prompt_len, T, block, offset)
    n = len(starts)
    if n == 0:
        raise ValueError(f"a sequence of {T} tokens with a {prompt_len}-token prompt has no block of {block}")
    # All blocks of the continuation as one batch of draft forwards: block j sees the cache up to its seed.
    dev = seq.device
    ids = torch.full((B, n, block), mask_id, dtype=seq.dtype, device=dev)
    for j, s in enumerate(starts):
        ids[:, j, 0] = seq[:, s]
    targets = torch.stack([seq[:, s:s + block] for s in starts], 1).reshape(B * n, block)[:, 2:]
    ids = ids.view(B * n, block)
    pos = torch.stack([torch.arange(s, s + block, device=dev) for s in starts]).repeat(B, 1)
    past = [(k.repeat_interleave(n, 0), v.repeat_interleave(n, 0)) for k, v in kv]
    visible = torch.zeros(n, T, dtype=torch.bool, device=dev)
    for j, s in enumerate(starts):
        visible[j, :s] = True
    intra = torch.from_numpy(M.draft_block(block, seed_causal=True)).to(dev)
    mask = torch.cat([visible.repeat(B, 1)[:, None, :].expand(-1, block, -1),
                      intra.expand(B * n, block, block)], dim=-1)
    gate = torch.from_numpy(M.draft_gate(block, seed_causal=True)).to(dev).expand(B * n, block)
    # The head runs on the scored positions only (it is a fifth of a small model's weights).
    wanted = torch.arange(2, block, device=dev).expand(B * n, block - 2)
    logits, _ = model(ids, pos, mask, past_kv=past, draft_gate=gate, logit_index=wanted)
    is_eos = torch.isin(seq, torch.tensor(eos_ids, device=seq.device)).long()
    eos_before = torch.cumsum(is_eos, dim=1) - is_eos  # EOS strictly before t
    alive = (eos_before - eos_before[:, prompt_len:prompt_len + 1]) == 0
    alive = torch.stack([alive[:, s + 2:s + block] for s in starts], 1).reshape(B * n, block - 2)
    soft = None
    if teacher:  # the AR logits at t - 1 predict token t; context.ar_logits starts at prompt_len
        ar, p = context.ar_logits, prompt_len
        soft = torch.stack([ar[:, s + 1 - p:s + block - 1 - p] for s in starts], 1).reshape(B * n, block - 2, -1)
    return Drafts(logits, targets, alive, soft)


def draft_loss(d: Drafts, cfg: LossConfig = DEFAULT_LOSS, weights: torch.Tensor | None = None) -> torch.Tensor:
    """The adapter's loss on ``d`` under ``cfg``: weighted cross-entropy on the greedy tokens, optionally
    restricted to the positions verification reaches and plus a KL term to the frozen AR logits."""
    rows, width = d.targets.shape
    flat = d.logits.reshape(-1, d.logits.shape[-1]).float()
    ce = F.cross_entropy(flat, d.targets.reshape(-1), reduction="none").view(rows, width)
    if weights is None:
        weights = position_weights(width + 2, cfg.first_weight, cfg.last_weight)
    w = weights.to(ce.device, ce.dtype).expand(rows, width) * d.alive.to(ce.dtype)
    if cfg.prefix_only:  # position j counts if every position before it hits: the prefix + the first miss
        reached = torch.arange(width, device=ce.device) <= accepted_drafts(d.logits.detach(), d.targets)[:, None]
        w = w * reached.to(ce.dtype)
    per_position = ce
    if cfg.kl_weight > 0:
        if d.teacher is None:
            raise ValueError("kl_weight > 0 needs the frozen logits: draft_logits(..., teacher=True)")
        logq = F.log_softmax(flat, -1)
        logp = F.log_softmax(d.teacher.reshape(-1, d.teacher.shape[-1]).float(), -1)
        kl = (logp.exp() * (logp - logq)).sum(-1).view(rows, width)
        per_position = ce + cfg.kl_weight * kl
    return (per_position * w).sum() / w.sum().clamp(min=1.0)


def accepted_drafts(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per block, how many of draft positions 2 … L-1 greedy verification would accept (leading hits).

    A block's tokens per round are then ``2 + accepted``: d1 (the seed's AR prediction, always
    right) and the verifier's bonus token; its mean is the teacher-forced MAL at that block size.
    """
    return leading_hits(logits.argmax(-1) == targets)


def leading_hits(hits: torch.Tensor) -> torch.Tensor:
    """Per row of ``hits`` (bool ``[n, width]``), how many leading positions hit: what verification accepts."""
    return torch.cumprod(hits.long(), dim=1).sum(1)


def distill_loss(model: NLDModel, seq: torch.Tensor, prompt_len: int, block: int,
                 weights: torch.Tensor | None = None, offset: int = 0,
                 cfg: LossConfig = DEFAULT_LOSS) -> torch.Tensor:
    """Self-distillation loss of the draft adapter: :func:`draft_loss` of :func:`draft_logits`."""
    return draft_loss(draft_logits(model, seq, prompt_len, block, offset, teacher=cfg.kl_weight > 0), cfg, weights)
