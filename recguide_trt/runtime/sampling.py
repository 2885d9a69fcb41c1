"""Temperature / top-p probabilities and the speculative-sampling acceptance rule (numpy)."""

from __future__ import annotations

import numpy as np


def probs_from_logits(logits: np.ndarray, temperature: float, top_p: float,
                      exclude: int | None = None, top_k: int = 0, min_p: float = 0.0) -> np.ndarray:
    """Softmax of ``logits / temperature`` over the last axis, then (vLLM's order) the tokens below ``min_p``
    times the most likely one's probability dropped, then all but the ``top_k`` most likely (ties at the k-th
    kept; 0: none dropped), then the top-p nucleus."""
    x = logits.astype(np.float64) / max(temperature, 1e-6)
    if exclude is not None:
        x = x.copy()
        x[..., exclude] = -np.inf
    x -= x.max(-1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(-1, keepdims=True)
    if min_p > 0:
        p = np.where(p >= min_p * p.max(-1, keepdims=True), p, 0.0)
        p /= p.sum(-1, keepdims=True)
    if 0 < top_k < p.shape[-1]:
        kth = -np.partition(-p, top_k - 1, axis=-1)[..., top_k - 1:top_k]
        p = np.where(p >= kth, p, 0.0)
        p /= p.sum(-1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, -1)
        keep_sorted = (np.cumsum(sorted_p, -1) - sorted_p) < top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, -1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(-1, keepdims=True)
    return p


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    return int(min(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"), p.shape[-1] - 1))


def speculative_accept(drafts: list[int], q: np.ndarray, p: np.ndarray,
                       rng: np.random.Generator) -> tuple[int, int]:
    """Accept a prefix of ``drafts`` against target ``p`` so the output follows ``p`` exactly.

    drafts ``d1 … dk`` were sampled from ``q[0 … k-1]``; ``p[i]`` is the target distribution of the
    token after verify position i (``p`` has k + 1 rows). Returns (accepted count c, next token):
    a resample from ``max(p - q, 0)`` at the first rejection, else a bonus sample from ``p[k]``.
    """
    for i, d in enumerate(drafts):
        if rng.random() * q[i, d] <= p[i, d] and q[i, d] > 0:
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        total = residual.sum()
        return i, sample(residual if total > 0 else p[i], rng)
    return len(drafts), sample(p[len(drafts)], rng)
