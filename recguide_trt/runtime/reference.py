"""Plain AR greedy decoding straight on the backbone: the ground truth every policy must match."""

from __future__ import annotations

import numpy as np
import torch

from ..model.backbone import NLDModel
from ..model.masks import causal


@torch.inference_mode()
def reference_greedy(model: NLDModel, prompt_ids: list[int], max_tokens: int,
                     eos_token_id: int | None = None) -> tuple[list[int], list[float]]:
    """Batch-1 AR greedy with a KV cache. Returns tokens and the top-1/top-2 logit margin of each."""
    ids = torch.tensor([prompt_ids])
    n = len(prompt_ids)
    logits, kv = model(ids, torch.arange(n)[None], torch.from_numpy(causal(n))[None])
    out: list[int] = []
    margins: list[float] = []
    past = kv
    for i in range(max_tokens):
        top = logits[0, -1].float().topk(2)
        tok = int(logits[0, -1].argmax())
        out.append(tok)
        margins.append(float(top.values[0] - top.values[1]))
        if tok == eos_token_id or i == max_tokens - 1:
            break
        pos = n + i
        logits, kv = model(torch.tensor([[tok]]), torch.tensor([[pos]]), torch.ones(1, 1, pos + 1, dtype=torch.bool),
                           past_kv=past)
        past = [(torch.cat([pk, k], 2), torch.cat([pv, v], 2)) for (pk, pv), (k, v) in zip(past, kv)]
    return out, margins


NEAR_TIE = 1e-5
"""fp32 logit margin below which a batched forward may legitimately flip the argmax (DESIGN.md §2)."""


def first_divergence(got: list[int], ref: list[int]) -> int | None:
    for i, (a, b) in enumerate(zip(got, ref)):
        if a != b:
            return i
    if len(got) != len(ref):
        return min(len(got), len(ref))
    return None


def is_near_tie(margins: list[float], index: int, threshold: float = NEAR_TIE) -> bool:
    return index < len(margins) and bool(np.abs(margins[index]) < threshold)
