"""Attention masks of the three modes, as boolean numpy arrays (True = may attend).

One graph serves every mode: the mask alone selects causal (AR / prefill / verify), draft-block
(bidirectional inside the block, sees the committed prefix) or fused rows (RecGuide overlap).
Masks here cover the new tokens only (``[T, T]``); the cached prefix is always fully visible.
"""

from __future__ import annotations

import numpy as np


def causal(n: int) -> np.ndarray:
    return np.tri(n, dtype=bool)


def draft_block(n: int) -> np.ndarray:
    return np.ones((n, n), dtype=bool)


def fused_rows(verify_len: int, shared: int, draft_len: int) -> np.ndarray:
    """Verify row (causal, ``verify_len`` tokens) followed by a prospective draft row.

    The prospective row's ``draft_len`` tokens see the first ``shared`` verify-row tokens (the
    part of the verify row the prospective block assumes accepted) and each other; the verify
    row never sees the prospective row, so its logits and K/V equal a plain verify forward's.
    """
    n = verify_len + draft_len
    m = np.zeros((n, n), dtype=bool)
    m[:verify_len, :verify_len] = causal(verify_len)
    m[verify_len:, :shared] = True
    m[verify_len:, verify_len:] = True
    return m


def block_diffusion_training(n: int, block: int, offset: int = 0) -> np.ndarray:
    """``[2n, 2n]`` mask over (clean copy, noisy copy) of one sequence, as in NLD training.

    Clean tokens are causal among themselves. A noisy token of block b (blocks start at
    ``offset`` and every ``block`` tokens after) sees the clean tokens of earlier blocks and the
    noisy tokens of its own block, bidirectionally.
    """
    idx = np.arange(n)
    blk = np.where(idx < offset, 0, (idx - offset) // block + (1 if offset > 0 else 0))
    m = np.zeros((2 * n, 2 * n), dtype=bool)
    m[:n, :n] = causal(n)
    m[n:, :n] = blk[:, None] > blk[None, :]
    m[n:, n:] = blk[:, None] == blk[None, :]
    return m
