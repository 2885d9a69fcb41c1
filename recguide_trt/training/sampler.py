"""Training the draft sampler (:mod:`recguide_trt.model.draft_sampler`) after the draft adapter.

The adapter stays frozen. Each block of each greedy continuation is drafted as at inference
(:func:`~.distill.draft_logits`); at every draft position the backend's candidates (the top ``k`` ids,
MASK excluded) and their draft log-probabilities are kept with the token before the position. Teacher
forcing that previous token with the target is exact for acceptance: inside the accepted prefix the
drafted token *is* the target, and past the first miss nothing is accepted anyway. The sampler is then
fitted by cross-entropy over the candidates (positions whose target is not among them teach nothing:
no choice among the candidates would be accepted there). A few minutes on a CPU: the features are
collected once, and the MLP is small.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

from ..backends.base import TOPK
from ..model.backbone import NLDModel
from ..model.draft_sampler import EPS, FIRST_POSITION, DraftSamplerWeights
from .distill import block_starts, draft_logits, frozen_context, holds_block, leading_hits

log = logging.getLogger(__name__)

CANDIDATES = TOPK
"""Candidates per position: the backends' ``top_ids`` width."""


class Candidates(NamedTuple):
    """Per draft position (rows: blocks, columns: block positions 2 … L-1)."""

    prev: torch.Tensor
    """``[n, L-2]`` the target token before the position."""
    ids: torch.Tensor
    """``[n, L-2, k]`` the draft's top-k ids, MASK excluded."""
    log_probs: torch.Tensor
    """``[n, L-2, k]`` their log-probabilities (softmax without MASK, as the backends compute them)."""
    targets: torch.Tensor
    """``[n, L-2]`` the greedy tokens."""


@torch.no_grad()
def collect_candidates(model: NLDModel, pairs: list[tuple[list[int], list[int]]], block: int,
                       k: int = CANDIDATES, desc: str = "sampler features") -> Candidates:
    """:class:`Candidates` of every block of ``pairs`` (prompt, continuation) wholly before an EOS."""
    mask = model.config.mask_token_id
    parts: list[tuple[torch.Tensor, ...]] = []
    for prompt, cont in tqdm(pairs, desc=desc, unit="seq"):
        seq, plen = torch.tensor([prompt + cont]), len(prompt)
        if not holds_block(len(cont), block):
            continue
        d = draft_logits(model, seq, plen, block, context=frozen_context(model, seq, plen))
        logits = d.logits.float()
        logits[..., mask] = -torch.inf
        vals, ids = logits.topk(k, -1)
        logp = vals - torch.logsumexp(logits, -1, keepdim=True)
        prev = torch.stack([seq[0, s + 1:s + block - 1] for s in block_starts(plen, seq.shape[1], block)])
        live = d.alive.all(1)
        parts.append((prev[live], ids[live], logp[live], d.targets[live]))
    if not parts:
        raise ValueError(f"no continuation holds a block of {block} tokens")
    return Candidates(*(torch.cat([p[i] for p in parts]) for i in range(4)))


class SamplerHead(nn.Module):
    """The sampler's formula in torch (the runtime's numpy one computes the same; a test holds them equal)."""

    def __init__(self, hidden: int, width: int, offsets: int):
        super().__init__()
        self.offset = nn.Parameter(torch.zeros(offsets, hidden))
        self.up = nn.Linear(hidden, width)
        self.down = nn.Linear(width, hidden)
        self.repeat = nn.Parameter(torch.zeros(offsets))
        nn.init.zeros_(self.down.weight)  # starts as the plain draft: argmax of its own probabilities
        nn.init.zeros_(self.down.bias)

    def forward(self, embed: torch.Tensor, head: torch.Tensor, prev: torch.Tensor, offsets: torch.Tensor,
                ids: torch.Tensor, log_probs: torch.Tensor) -> torch.Tensor:
        off = offsets.clamp(max=self.offset.shape[0] - 1)
        x = F.layer_norm(embed[prev].float(), (embed.shape[1],), eps=EPS) + self.offset[off]
        delta = self.down(F.silu(self.up(x)))
        rep = self.repeat[off][:, None] * (ids == prev[:, None]).float()
        return log_probs + torch.einsum("nd,nkd->nk", delta, head[ids].float()) + rep

    def weights(self) -> DraftSamplerWeights:
        def a(t: torch.Tensor) -> np.ndarray:
            return t.detach().float().numpy().copy()
        return DraftSamplerWeights(offset=a(self.offset), up_weight=a(self.up.weight), up_bias=a(self.up.bias),
                                   down_weight=a(self.down.weight), down_bias=a(self.down.bias),
                                   repeat=a(self.repeat))


def _flat(c: Candidates) -> tuple[torch.Tensor, ...]:
    n, P = c.targets.shape
    offsets = torch.arange(P).expand(n, P).reshape(-1)
    return c.prev.reshape(-1), offsets, c.ids.reshape(n * P, -1), c.log_probs.reshape(n * P, -1), c.targets.reshape(-1)


def oracle_mal(c: Candidates, k: int) -> float:
    """Tokens per round if every position picked its target whenever it is among its first ``k`` candidates:
    the most any choice among them can reach."""
    return _tokens_per_round((c.ids[..., :k] == c.targets[..., None]).any(-1))


@torch.no_grad()
def sampler_mal(head: SamplerHead | None, embed: torch.Tensor, lm_head: torch.Tensor, c: Candidates) -> float:
    """Tokens per round (2 + leading accepted draft positions) when each position picks among its
    candidates by ``head`` (None: the plain draft's top-1)."""
    n, P = c.targets.shape
    if head is None:
        pick = c.ids[..., 0]
    else:
        prev, offsets, ids, logp, _ = _flat(c)
        s = torch.cat([head(embed, lm_head, prev[i:i + 8192], offsets[i:i + 8192], ids[i:i + 8192],
                            logp[i:i + 8192]) for i in range(0, len(prev), 8192)])
        pick = ids.gather(1, s.argmax(1, keepdim=True)).view(n, P)
    return _tokens_per_round(pick == c.targets)


def _tokens_per_round(hits: torch.Tensor) -> float:
    """2 (d1 and the bonus token) + the mean leading hits of the blocks' draft positions."""
    return 2.0 + float(leading_hits(hits).float().mean())


def train_sampler(embed: torch.Tensor, lm_head: torch.Tensor, train: Candidates, held: Candidates,
                  width: int = 64, offsets: int = 6, epochs: int = 4, lr: float = 1e-3,
                  batch: int = 256, seed: int = 0) -> tuple[DraftSamplerWeights, dict]:
    """Fit the sampler on ``train``; returns its weights and a report (teacher-forced MAL on ``held`` before
    and after, at the block size the candidates were collected at). ``embed`` / ``lm_head``: the frozen
    model's input embedding and output head weights."""
    torch.manual_seed(seed)
    head = SamplerHead(embed.shape[1], width, offsets)
    prev, offs, ids, logp, tgt = _flat(train)
    label = ids == tgt[:, None]
    usable = label.any(1).nonzero().squeeze(1)  # a target outside the candidates teaches nothing
    label = label.float().argmax(1)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01)
    before = sampler_mal(None, embed, lm_head, held)
    t0 = time.time()
    gen = torch.Generator().manual_seed(seed)
    steps = epochs * ((len(usable) + batch - 1) // batch)
    with tqdm(total=steps, desc="sampler", unit="step") as bar:
        for _ in range(epochs):
            perm = usable[torch.randperm(len(usable), generator=gen)]
            for s in range(0, len(perm), batch):
                i = perm[s:s + batch]
                loss = F.cross_entropy(head(embed, lm_head, prev[i], offs[i], ids[i], logp[i]), label[i])
                opt.zero_grad()
                loss.backward()
                opt.step()
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}")
    after = sampler_mal(head, embed, lm_head, held)
    report = {"positions": int(train.targets.numel()), "usable_positions": int(len(usable)), "width": width,
              "offsets": offsets, "epochs": epochs, "lr": lr, "train_s": round(time.time() - t0, 1),
              "heldout_block": int(held.targets.shape[1] + FIRST_POSITION),
              "heldout_teacher_forced_mal": {"before": round(before, 4), "after": round(after, 4),
                                             **{f"oracle_top{k}": round(oracle_mal(held, k), 4)
                                                for k in range(2, held.ids.shape[-1] + 1)}}}
    log.info("draft sampler: held-out teacher-forced MAL %.3f → %.3f", before, after)
    return head.weights(), report
