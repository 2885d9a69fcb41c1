"""The mode masks, and the causal-seed draft convention end to end on a real backbone."""

from __future__ import annotations

import numpy as np
import torch

from recguide_trt.model import masks
from tests.conftest import random_model, tiny_config


def test_draft_block_conventions():
    assert masks.draft_block(4).all()
    m = masks.draft_block(4, seed_causal=True)
    assert m[0].tolist() == [True, False, False, False]  # the seed sees only itself (and the prefix)
    assert m[1:].all()  # the masks see the seed and each other


def test_draft_gate_conventions():
    assert masks.draft_gate(3).tolist() == [1.0, 1.0, 1.0]
    assert masks.draft_gate(3, seed_causal=True).tolist() == [0.0, 1.0, 1.0]


def test_fused_rows_keep_the_verify_row_causal_and_the_seed_convention():
    m = masks.fused_rows(4, 2, 3, seed_causal=True)
    assert (m[:4, :4] == masks.causal(4)).all() and not m[:4, 4:].any()
    assert m[4:, :2].all() and not m[4:, 2:4].any()
    assert (m[4:, 4:] == masks.draft_block(3, seed_causal=True)).all()


def test_block_diffusion_training_seed_causal():
    n, block = 8, 4
    m = masks.block_diffusion_training(n, block, seed_causal=True)
    clean, noisy = m[n:, :n], m[n:, n:]
    # Noisy token 5 (block 1 = positions 4..7, seed 4): the clean prefix up to and including the seed.
    assert clean[5].tolist() == [True] * 5 + [False] * 3
    # ... and the noisy non-seed tokens of its own block, never the noisy copy of the seed.
    assert noisy[5].tolist() == [False] * 5 + [True] * 3
    # The plain convention sees the noisy seed instead of the clean one.
    plain = masks.block_diffusion_training(n, block)
    assert plain[n + 5, :n].tolist() == [True] * 4 + [False] * 4 and plain[n + 5, n + 4]


def test_causal_seed_logits_are_the_ar_logits():
    """A seed-causal draft row's seed position computes exactly what AR mode computes there."""
    cfg = tiny_config(draft_seed_causal=True)
    model = random_model(cfg)
    model.attach_draft_adapter(4, 8, ("q_proj", "o_proj"))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.normal_(0, 0.2)  # a non-zero adapter, so an ungated seed would be visible
    rng = np.random.default_rng(0)
    seq = torch.tensor([rng.integers(4, 96, size=10)])
    P = 9  # prefix of 9 cached tokens, seed = seq[9]
    with torch.no_grad():
        full, _ = model(seq, torch.arange(10)[None], torch.from_numpy(masks.causal(10))[None])
        _, kv = model(seq[:, :P], torch.arange(P)[None], torch.from_numpy(masks.causal(P))[None])
        L = 5
        ids = torch.tensor([[int(seq[0, P])] + [cfg.mask_token_id] * (L - 1)])
        intra = torch.from_numpy(masks.draft_block(L, seed_causal=True))[None]
        mask = torch.cat([torch.ones(1, L, P, dtype=torch.bool), intra], -1)
        gate = torch.tensor([[0.0] + [1.0] * (L - 1)])
        draft, _ = model(ids, torch.arange(P, P + L)[None], mask, past_kv=kv, draft_gate=gate)
        bidir, _ = model(ids, torch.arange(P, P + L)[None], torch.ones(1, L, P + L, dtype=torch.bool),
                         past_kv=kv, draft_gate=torch.ones(1, L))
    torch.testing.assert_close(draft[0, 0], full[0, P], rtol=1e-4, atol=1e-5)
    assert (bidir[0, 0] - full[0, P]).abs().max() > 1e-2  # the NLD convention differs there
