"""What one native forward costs, by shape, against the machine's two limits (bytes streamed, FLOPs).

A shape is ``rows × tokens`` over a cached past (a batch-1 block of 8 is ``1×8``; a batch-64 decode step
is ``64×1``). Per shape: the best of ``reps`` forwards (verify-mode rows: causal, adapter off), the
ratio to the ``1×1`` step, the weight bytes streamed per forward over its time (GB/s) and the FLOPs
(2 × weights × tokens + attention) over its time (GFLOP/s). The machine's own read bandwidth and
FMA rate are measured in the same run by the extension (same threads, same vector path), so each
row can be read as a fraction of what this CPU can do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from ..backends.base import ForwardBatch

DEFAULT_SHAPES = ((1, 1), (1, 4), (1, 8), (1, 16), (1, 32), (8, 1), (64, 1))


@dataclass
class ShapeCost:
    """One shape's best forward time and what it moved and computed."""

    rows: int
    tokens: int
    past: int
    ms: float
    weight_bytes: int
    flops: float

    @property
    def gbps(self) -> float:
        return self.weight_bytes / (self.ms * 1e-3) / 1e9

    @property
    def gflops(self) -> float:
        return self.flops / (self.ms * 1e-3) / 1e9


def weight_bytes(model) -> int:
    """Bytes of the projections and the head as the native backend stores them (bf16 where exact)."""
    total = 0
    for name, p in model.named_parameters():
        if p.ndim != 2 or "embed_tokens" in name or "lora_" in name:
            continue
        exact = bool(torch.equal(p.detach().to(torch.bfloat16).float(), p.detach().float()))
        total += p.numel() * (2 if exact else 4)
    return total


def forward_flops(model, rows: int, tokens: int, past: int, prefill: bool = False) -> float:
    """2 × matrix weights × tokens, plus attention's scores and P·V over past + causal new keys. A
    ``prefill`` wants the head on each row's last token only: its head counts ``rows`` tokens."""
    cfg = model.config
    mats = {n: p.numel() for n, p in model.named_parameters()
            if p.ndim == 2 and "embed_tokens" not in n and "lora_" not in n}
    head = sum(v for n, v in mats.items() if "head" in n)
    n = rows * tokens
    keys = rows * sum(past + t + 1 for t in range(tokens))  # key positions each query sees
    attn = 2 * 2 * cfg.num_attention_heads * cfg.head_dim * keys * cfg.num_hidden_layers
    if prefill:
        return 2.0 * (sum(mats.values()) - head) * n + 2.0 * head * rows + attn
    return 2.0 * sum(mats.values()) * n + attn


def _causal_batch(slots: np.ndarray, tokens: int, past: int, seed: int, prefill: bool) -> ForwardBatch:
    """Causal rows of ``tokens`` random ids in ``slots`` over a cached past of ``past``; ``prefill``: the
    cache written and outputs from each row's last token only, as the engine prefills a prompt."""
    rows = len(slots)
    return ForwardBatch(slots=slots, past_lens=np.full(rows, past, np.int64),
                        input_ids=np.random.default_rng(seed).integers(100, 1000, (rows, tokens)),
                        position_ids=np.tile(past + np.arange(tokens), (rows, 1)),
                        intra_mask=np.tile(np.tri(tokens, dtype=bool), (rows, 1, 1)),
                        draft_gate=np.zeros((rows, tokens), np.float32), want_logits=np.zeros(rows, bool),
                        row_lens=np.full(rows, tokens), write_kv=prefill, last_only=prefill)


def verify_batch(rows: int, tokens: int, past: int, prefill: bool = False) -> ForwardBatch:
    """``rows`` causal rows of ``tokens`` over a cached past; ``prefill``: a prompt prefill instead (no
    past, the cache written, outputs from each row's last token only, as the engine prefills)."""
    return _causal_batch(np.arange(rows, dtype=np.int64), tokens, 0 if prefill else past, rows * 1000 + tokens,
                         prefill)


def fill_past(backend, rows: int, past: int) -> None:
    """Give slots 0 … rows-1 a cached past of ``past`` tokens (prefill in chunks of 4 rows)."""
    for r0 in range(0, rows, 4):
        backend.forward(_causal_batch(np.arange(r0, min(rows, r0 + 4), dtype=np.int64), past, 0, r0, prefill=True))


def time_shapes(backends: dict, model, shapes, past: int, reps: int, past_for: dict | None = None,
                prefill: bool = False) -> dict:
    """Best-of-``reps`` ms per (backend name, shape), interleaved rep by rep over shapes and backends
    (a shared CPU's load drifts: every ratio compares forwards timed side by side). ``prefill``: each
    shape is a prompt prefill (:func:`verify_batch`), over no past."""
    past_for = {} if prefill else past_for or {}
    past = 0 if prefill else past
    pasts = {shape: past_for.get(shape, past) for shape in shapes}
    if not prefill:
        for be in backends.values():  # one fill for all shapes: a shorter past reads a prefix of a longer one
            fill_past(be, max(r for r, _ in shapes), max(pasts.values()))
    batches = {shape: verify_batch(shape[0], shape[1], pasts[shape], prefill) for shape in shapes}
    best: dict = {}
    for _ in range(reps):
        for shape in shapes:
            for name, be in backends.items():
                time.sleep(0.003)  # the other build's pool workers stop spinning before this one runs
                t0 = time.perf_counter()
                be.forward(batches[shape])
                dt = (time.perf_counter() - t0) * 1e3
                best[(name, shape)] = min(best.get((name, shape), float("inf")), dt)
    wb = weight_bytes(model)
    return {key: ShapeCost(key[1][0], key[1][1], pasts[key[1]], ms, wb,
                           forward_flops(model, key[1][0], key[1][1], pasts[key[1]], prefill))
            for key, ms in best.items()}


def machine_limits(ext, threads: int, seconds: float = 0.5) -> dict[str, float]:
    """Read bandwidth (GB/s, 1 GiB buffer, best of 3), float32 FMA rate and bf16 dot rate (GFLOP/s; the
    latter is ``compute_dtype="bfloat16"``'s instruction, emulated where the CPU lacks AVX512_BF16) on
    ``threads`` threads."""
    buf = torch.ones(1 << 28, dtype=torch.float32)
    return {"stream_GBps": float(ext.stream_gbps(buf, threads, 3)),
            "fma_GFLOPs": float(ext.fma_gflops(threads, seconds)),
            "bf16_dot_GFLOPs": float(ext.bf16_dot_gflops(threads, seconds))}
