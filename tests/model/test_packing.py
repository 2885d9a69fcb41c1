"""Token packing: the real tokens of a right-padded batch give the same results without the padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recguide_trt.model import masks
from tests.conftest import random_model, tiny_config


def _padded_inputs(cfg, lens: list[int], past: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    B, T = len(lens), max(lens)
    ids = torch.randint(4, cfg.vocab_size, (B, T), generator=g)
    pos = past + torch.arange(T)[None].expand(B, T)
    intra = np.zeros((B, T, T), bool)
    intra[:, np.arange(T), np.arange(T)] = True
    gate = torch.zeros(B, T)
    for b, n in enumerate(lens):
        # Alternate causal rows and draft blocks (bidirectional, gated) as a mixed step does.
        intra[b, :n, :n] = masks.causal(n) if b % 2 == 0 else masks.draft_block(n)
        if b % 2:
            gate[b, :n] = torch.from_numpy(masks.draft_gate(n))
    mask = torch.cat([torch.ones(B, T, past, dtype=torch.bool), torch.from_numpy(intra)], dim=-1)
    kv = [(torch.randn(B, cfg.num_key_value_heads, past, cfg.head_dim, generator=g),
           torch.randn(B, cfg.num_key_value_heads, past, cfg.head_dim, generator=g))
          for _ in range(cfg.num_hidden_layers)]
    real = torch.arange(T)[None] < torch.tensor(lens)[:, None]
    return ids, pos, mask, kv, gate, real


@pytest.mark.parametrize("lens", [[1, 5, 1, 3], [7, 1, 1, 1, 1, 1], [4, 4], [1]])
@pytest.mark.parametrize("adapter", [False, True])
def test_packed_forward_matches_padded_on_real_tokens(lens, adapter):
    cfg = tiny_config()
    model = random_model(cfg, seed=11)
    if adapter:
        model.attach_draft_adapter(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "o_proj", "down_proj"))
        for m in model.modules():
            if getattr(m, "lora_B", None) is not None:
                torch.nn.init.normal_(m.lora_B.weight, std=0.5)
    ids, pos, mask, kv, gate, real = _padded_inputs(cfg, lens, past=6, seed=len(lens))
    index = torch.nonzero(real.reshape(-1)).squeeze(1)
    with torch.inference_mode():
        padded, present = model(ids, pos, mask, kv, gate)
        packed, present_p = model(ids, pos, mask, kv, gate, token_index=index)
    assert packed.shape == (int(sum(lens)), cfg.vocab_size)
    torch.testing.assert_close(packed, padded[real], rtol=1e-5, atol=1e-5)
    assert torch.equal(packed.argmax(-1), padded[real].argmax(-1))
    for (k, v), (kp, vp) in zip(present, present_p):
        # K/V of real tokens (padding's K/V are never read: they lie past each row's length).
        torch.testing.assert_close(kp.transpose(1, 2)[real], k.transpose(1, 2)[real], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(vp.transpose(1, 2)[real], v.transpose(1, 2)[real], rtol=1e-5, atol=1e-5)


def test_draft_gate_leaves_ungated_tokens_bit_identical():
    cfg = tiny_config()
    model = random_model(cfg, seed=3)
    model.attach_draft_adapter(rank=4, alpha=8.0, target_modules=("q_proj", "k_proj", "v_proj", "o_proj",
                                                                   "gate_proj", "up_proj", "down_proj"))
    for m in model.modules():
        if getattr(m, "lora_B", None) is not None:
            torch.nn.init.normal_(m.lora_B.weight, std=0.5)
    ids, pos, mask, kv, gate, _ = _padded_inputs(cfg, [6, 6, 6], past=4, seed=0)
    gate[:, :3] = 0  # each row: 3 ungated tokens, then gated ones that they cannot see
    mask[:, :3, 4 + 3:] = False
    with torch.inference_mode():
        base, _ = model(ids, pos, mask, kv, None)
        gated, _ = model(ids, pos, mask, kv, gate)
    assert torch.equal(gated[:, :3], base[:, :3])
    assert not torch.allclose(gated[:, 3:], base[:, 3:])


def test_token_index_and_logit_index_are_exclusive():
    cfg = tiny_config()
    model = random_model(cfg)
    ids, pos, mask, kv, gate, real = _padded_inputs(cfg, [2, 1], past=2, seed=0)
    index = torch.nonzero(real.reshape(-1)).squeeze(1)
    with pytest.raises(ValueError, match="cannot be combined"):
        model(ids, pos, mask, kv, token_index=index, logit_index=torch.zeros(2, 1, dtype=torch.long))
