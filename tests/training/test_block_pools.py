"""Which continuations a training step of block L may draw (``block_pools``): every one it draws holds a
block of L at every offset the step may pick, and a block no continuation can hold is named up front."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recguide_trt.model.checkpoint import load_checkpoint
from recguide_trt.training import draft_logits
from recguide_trt.training.drafter import block_pools
from tests.conftest import EMBEDDED, has_embedded


def pairs_of(lengths: list[int], prompt: int = 5) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(0)
    return [(rng.integers(10, 100, prompt).tolist(), rng.integers(10, 100, n).tolist()) for n in lengths]


def test_each_block_draws_only_continuations_that_hold_it():
    pools = block_pools(pairs_of([3, 5, 9, 16, 17, 40]), (4, 8, 16))
    assert pools == {4: [1, 2, 3, 4, 5], 8: [2, 3, 4, 5], 16: [4, 5]}


def test_a_block_no_continuation_holds_is_named():
    with pytest.raises(ValueError, match=r"block\(s\) \[8, 16\].*longest has 7 tokens.*--new-tokens"):
        block_pools(pairs_of([4, 7]), (4, 8, 16))


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
def test_every_drawn_continuation_drafts_at_every_offset_the_step_picks():
    """The training step picks an offset in [0, min(L, room)] (room = continuation - L); a 12-token
    continuation at block 16 (the failure this guards against: "has no block of 16") is left out."""
    model = load_checkpoint(EMBEDDED).model
    pairs = pairs_of([5, 9, 12, 17, 20])
    pools = block_pools(pairs, (4, 8, 16))
    assert 2 not in pools[16]
    for block, pool in pools.items():
        for i in pool:
            prompt, cont = pairs[i]
            seq = torch.tensor([prompt + cont])
            room = len(cont) - block
            for offset in range(min(block, room) + 1):
                assert draft_logits(model, seq, len(prompt), block, offset).logits.shape[0] >= 1
    prompt, cont = pairs[2]
    with pytest.raises(ValueError, match="has no block of 16"):
        draft_logits(model, torch.tensor([prompt + cont]), len(prompt), 16)
