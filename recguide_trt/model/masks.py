"""Attention masks of the three modes, as boolean numpy arrays (True = may attend).

One graph serves every mode: the mask alone selects causal (AR / prefill / verify), draft-block
(bidirectional inside the block, sees the committed prefix) or fused rows (RecGuide overlap).
Masks here cover the new tokens only (``[T, T]``); the cached prefix is always fully visible.
"""

from __future__ import annotations

import numpy as np


def causal(n: int) -> np.ndarray:
    return np.tri(n, dtype=bool)


def draft_block(n: int, seed_causal: bool = False) -> np.ndarray:
    """``[seed, MASK x (n-1)]``: bidirectional, or with the seed causal (``NLDConfig.draft_seed_causal``)."""
    m = np.ones((n, n), dtype=bool)
    if seed_causal:
        m[0, 1:] = False
    return m


def draft_gate(n: int, seed_causal: bool = False) -> np.ndarray:
    """Draft-adapter gate of a ``[seed, MASK x (n-1)]`` block: 1 everywhere, except a causal seed,
    which runs exactly as in AR mode (adapter off)."""
    gate = np.ones(n, np.float32)
    if seed_causal:
        gate[0] = 0.0
    return gate


def fused_rows(verify_len: int, shared: int, draft_len: int, seed_causal: bool = False) -> np.ndarray:
    """Verify row (causal, ``verify_len`` tokens) followed by a prospective draft row.

    The prospective row's ``draft_len`` tokens see the first ``shared`` verify-row tokens (the
    part of the verify row the prospective block assumes accepted) and each other; the verify
    row never sees the prospective row, so its logits and K/V equal a plain verify forward's.
    With ``seed_causal`` the block's seed sees only the shared tokens and itself (as in
    :func:`draft_block`).
    """
    n = verify_len + draft_len
    m = np.zeros((n, n), dtype=bool)
    m[:verify_len, :verify_len] = causal(verify_len)
    m[verify_len:, :shared] = True
    m[verify_len:, verify_len:] = draft_block(draft_len, seed_causal)
    return m


def block_diffusion_training(n: int, block: int, offset: int = 0, seed_causal: bool = False) -> np.ndarray:
    """``[2n, 2n]`` mask over (clean copy, noisy copy) of one sequence, as in NLD training.

    Clean tokens are causal among themselves. A noisy token of block b (blocks start at
    ``offset`` and every ``block`` tokens after) sees the clean tokens of earlier blocks and the
    noisy tokens of its own block, bidirectionally. With ``seed_causal`` (the first token of each
    block is its seed, as at inference) noisy tokens see the *clean* seed instead of the noisy
    copy's, which matches a draft whose seed runs causally (:func:`draft_block`); the noisy seed
    copies then see only the clean prefix up to themselves and are never attended to.
    """
    idx = np.arange(n)
    blk = np.where(idx < offset, 0, (idx - offset) // block + (1 if offset > 0 else 0))
    m = np.zeros((2 * n, 2 * n), dtype=bool)
    m[:n, :n] = causal(n)
    m[n:, :n] = blk[:, None] > blk[None, :]
    m[n:, n:] = blk[:, None] == blk[None, :]
    if seed_causal:
        start = np.searchsorted(blk, blk)  # first index of each position's block: its seed
        m[n:, :n] = start[:, None] >= idx[None, :]
        m[n:, n:] &= idx[None, :] != start[None, :]
        m[n + idx, n + idx] |= idx == start
    return m
