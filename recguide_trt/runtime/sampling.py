"""Temperature / top-p probabilities and the speculative-sampling acceptance rule (numpy)."""

from __future__ import annotations

import numpy as np


def probs_from_logits(logits: np.ndarray, temperature: float, top_p: float,
                      exclude: int | None = None, top_k: int = 0, min_p: float = 0.0) -> np.ndarray:
    """Softmax of ``logits / temperature`` over the last axis (float64), then (vLLM's order) the tokens below
    ``min_p`` times the most likely one's probability dropped, then all but the ``top_k`` most likely (ties at the
    k-th kept; 0: none dropped), then the top-p nucleus (:func:`nucleus`).

    The exponentials are taken in float32 and summed in float64: over a 49k vocabulary the float64 exp was most
    of a position's 0.7 ms (ad hoc timing, Zen 3), and every speculative round samples or scores ~2L positions."""
    x = np.asarray(logits, np.float32) / np.float32(max(temperature, 1e-6))
    if exclude is not None:
        x[..., exclude] = -np.inf
    x -= x.max(-1, keepdims=True)
    p = np.exp(x, out=x).astype(np.float64)
    p /= p.sum(-1, keepdims=True)
    if min_p > 0:
        p = np.where(p >= min_p * p.max(-1, keepdims=True), p, 0.0)
        p /= p.sum(-1, keepdims=True)
    if 0 < top_k < p.shape[-1]:
        kth = -np.partition(-p, top_k - 1, axis=-1)[..., top_k - 1:top_k]
        p = np.where(p >= kth, p, 0.0)
        p /= p.sum(-1, keepdims=True)
    if top_p < 1.0:
        rows = p.reshape(-1, p.shape[-1])
        for row in rows:
            nucleus(row, top_p)
        p = rows.reshape(p.shape)
    return p


def nucleus(p: np.ndarray, top_p: float) -> None:
    """Keep (in place, renormalised) the tokens of ``p`` (one row, summing to 1) whose probability mass before them,
    in descending order with ties by token id, is below ``top_p``.

    Sorts only candidates: the tokens at or above a threshold (a fraction of the largest probability, lowered until
    the candidates' mass reaches ``top_p``). Every token outside then has at least that mass before it, so it is
    dropped as a full sort would drop it. A full stable sort of 49k tokens cost 7 ms a position (ad hoc timing, Zen 3)."""
    top = p.max()
    for shift in (4, 10, 20, 40, None):
        cand = np.flatnonzero(p >= top * 2.0 ** -shift) if shift is not None else np.arange(p.shape[0])
        order = cand[np.argsort(-p[cand], kind="stable")]  # ascending ids in: ties stay in id order
        mass = np.cumsum(p[order])
        if mass[-1] >= top_p:
            break
    before = np.concatenate([[0.0], mass[:-1]])
    keep = order[before < top_p]
    kept = p[keep]
    p[:] = 0.0
    p[keep] = kept / kept.sum()


SAMPLE_BLOCK = 256
"""Tokens per block of :func:`sample`'s two-level search."""


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """A token drawn from ``p`` (one row, not necessarily normalised) with one ``rng.random()``, never one whose
    probability is 0 (a token outside the nucleus).

    Two levels: a block of :data:`SAMPLE_BLOCK` tokens by the blocks' sums, then a token inside it. numpy's cumsum
    over all of SmolLM2's 49k tokens took 0.2 ms (ad hoc timing, Zen 3), one per sampled position."""
    sums = np.add.reduceat(p, np.arange(0, p.shape[0], SAMPLE_BLOCK))
    u = rng.random()
    j, rest = _pick(sums, u * sums.sum())
    block = p[j * SAMPLE_BLOCK:(j + 1) * SAMPLE_BLOCK]
    i, _ = _pick(block, rest)
    return j * SAMPLE_BLOCK + i


def _pick(weights: np.ndarray, target: float) -> tuple[int, float]:
    """The index whose cumulative weight first exceeds ``target``, among those above 0 (rounding cannot land on a
    zero), and how far into its weight the target falls."""
    support = np.flatnonzero(weights)
    mass = np.cumsum(weights[support])
    k = min(int(np.searchsorted(mass, target, side="right")), len(support) - 1)
    return int(support[k]), max(0.0, target - (mass[k - 1] if k else 0.0))


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
