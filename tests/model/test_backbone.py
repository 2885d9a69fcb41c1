"""The backbone against a peer implementation (transformers' Ministral3) and its own modes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recguide_trt.model import NLDModel, RopeConfig, masks
from tests.conftest import random_model, tiny_config

transformers = pytest.importorskip("transformers")


def to_ministral3(model: NLDModel):
    from transformers import Ministral3Config, Ministral3ForCausalLM

    c = model.config
    rope = {"rope_type": c.rope.rope_type, "rope_theta": c.rope.rope_theta,
            "llama_4_scaling_beta": c.rope.llama_4_scaling_beta,
            "original_max_position_embeddings": c.rope.original_max_position_embeddings}
    if c.rope.rope_type == "yarn":
        rope.update(factor=c.rope.factor, beta_fast=c.rope.beta_fast, beta_slow=c.rope.beta_slow,
                    mscale=c.rope.mscale, mscale_all_dim=c.rope.mscale_all_dim)
    hf_cfg = Ministral3Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings, rope_parameters=rope, tie_word_embeddings=False,
        pad_token_id=None, bos_token_id=None, eos_token_id=c.eos_token_id)
    hf_cfg._attn_implementation = "eager"
    hf = Ministral3ForCausalLM(hf_cfg).eval()
    sd = {k.replace("encoder.", "model.", 1).replace("diffusion_head", "lm_head"): v
          for k, v in model.state_dict().items()}
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not [m for m in missing if "rotary" not in m] and not unexpected, (missing, unexpected)
    return hf


CONFIGS = {
    "q_width_ne_hidden": tiny_config(hidden_size=48, head_dim=16, num_attention_heads=4),
    "yarn_llama4": tiny_config(hidden_size=32, head_dim=16, num_attention_heads=4, max_position_embeddings=4096,
                               rope=RopeConfig(rope_type="yarn", rope_theta=1e6, factor=16.0,
                                               original_max_position_embeddings=64, llama_4_scaling_beta=0.1)),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_causal_logits_match_transformers_ministral3(name):
    cfg = CONFIGS[name]
    model = random_model(cfg, seed=1, std=0.1)
    hf = to_ministral3(model)
    T = 40
    ids = torch.randint(0, cfg.vocab_size, (2, T), generator=torch.Generator().manual_seed(0))
    # Positions past original_max_position_embeddings exercise YaRN and the llama-4 query scale.
    start = 100 if name == "yarn_llama4" else 0
    pos = (start + torch.arange(T)).expand(2, T)
    with torch.no_grad():
        ours, _ = model(ids, pos, torch.from_numpy(masks.causal(T)).expand(2, T, T))
        ref = hf(input_ids=ids, position_ids=pos).logits
    rel = (ours - ref).abs().max() / ref.abs().max()
    assert rel < 1e-4, f"relative error {rel:.2e}"


def test_cached_forward_equals_full_forward():
    cfg = CONFIGS["yarn_llama4"]
    model = random_model(cfg, seed=2)
    T, split = 24, 17
    ids = torch.randint(0, cfg.vocab_size, (3, T), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(T).expand(3, T)
    full, _ = model(ids, pos, torch.from_numpy(masks.causal(T)).expand(3, T, T))
    _, kv = model(ids[:, :split], pos[:, :split], torch.from_numpy(masks.causal(split)).expand(3, split, split))
    n = T - split
    mask = torch.cat([torch.ones(3, n, split, dtype=torch.bool),
                      torch.from_numpy(masks.causal(n)).expand(3, n, n)], -1)
    tail, _ = model(ids[:, split:], pos[:, split:], mask, past_kv=kv)
    torch.testing.assert_close(tail, full[:, split:], rtol=1e-5, atol=1e-5)


def test_draft_mode_is_bidirectional_inside_the_block_only():
    cfg = tiny_config()
    model = random_model(cfg, seed=3)
    P, L = 10, 4
    prefix = torch.randint(4, cfg.vocab_size, (1, P))
    _, kv = model(prefix, torch.arange(P)[None], torch.from_numpy(masks.causal(P))[None])
    block = torch.tensor([[7] + [cfg.mask_token_id] * (L - 1)])
    mask = torch.cat([torch.ones(1, L, P, dtype=torch.bool), torch.from_numpy(masks.draft_block(L))[None]], -1)
    a, _ = model(block, (P + torch.arange(L))[None], mask, past_kv=kv)
    # Changing the last block token changes the seed position's logits (bidirectional) ...
    b, _ = model(torch.tensor([[7] + [cfg.mask_token_id] * (L - 2) + [9]]), (P + torch.arange(L))[None], mask,
                 past_kv=kv)
    assert not torch.allclose(a[0, 0], b[0, 0])
    # ... while causal verification of the same tokens does not look ahead.
    cmask = torch.cat([torch.ones(1, L, P, dtype=torch.bool), torch.from_numpy(masks.causal(L))[None]], -1)
    c, _ = model(block, (P + torch.arange(L))[None], cmask, past_kv=kv)
    d, _ = model(torch.tensor([[7] + [cfg.mask_token_id] * (L - 2) + [9]]), (P + torch.arange(L))[None], cmask,
                 past_kv=kv)
    torch.testing.assert_close(c[0, :-1], d[0, :-1])


def test_draft_adapter_only_changes_gated_tokens():
    cfg = tiny_config()
    model = random_model(cfg, seed=4)
    T = 8
    ids = torch.randint(4, cfg.vocab_size, (1, T))
    pos = torch.arange(T)[None]
    mask = torch.from_numpy(masks.causal(T))[None]
    base, _ = model(ids, pos, mask)
    model.attach_draft_adapter(rank=4, alpha=8.0, target_modules=("o_proj",))
    for m in model.modules():
        if getattr(m, "lora_B", None) is not None:
            torch.nn.init.normal_(m.lora_B.weight, std=0.5)
    gate = torch.zeros(1, T)
    gate[0, 5:] = 1
    out, _ = model(ids, pos, mask, draft_gate=gate)
    torch.testing.assert_close(out[0, :5], base[0, :5])
    assert not torch.allclose(out[0, 5:], base[0, 5:])


def test_draft_mask_embedding_changes_draft_masks_only():
    """The draft MASK embedding replaces MASK inputs in gated positions; a MASK token in an AR position
    (a prompt may contain it) keeps the base embedding, so AR outputs stay the base model's."""
    cfg = tiny_config()
    model = random_model(cfg, seed=5)
    T, mask_id = 8, cfg.mask_token_id
    ids = torch.randint(4, cfg.vocab_size, (1, T))
    ids[0, [2, 6, 7]] = mask_id
    pos = torch.arange(T)[None]
    mask = torch.from_numpy(masks.causal(T))[None]
    gate = torch.zeros(1, T)
    gate[0, 6:] = 1
    base, _ = model(ids, pos, mask, draft_gate=gate)
    model.attach_draft_mask_embedding()
    same, _ = model(ids, pos, mask, draft_gate=gate)  # initialised to the MASK row: nothing changes yet
    torch.testing.assert_close(same, base)
    with torch.no_grad():
        model.draft_mask_embedding.normal_(0, 1.0)
    out, _ = model(ids, pos, mask, draft_gate=gate)
    torch.testing.assert_close(out[0, :6], base[0, :6])  # the ungated MASK at 2 is untouched
    assert not torch.allclose(out[0, 6:], base[0, 6:])
    ar, _ = model(ids, pos, mask)  # no gate at all: the base model
    torch.testing.assert_close(ar, model(ids, pos, mask, draft_gate=torch.zeros(1, T))[0])


def test_fused_rows_mask_shapes():
    m = masks.fused_rows(4, 2, 3)
    assert m.shape == (7, 7)
    assert np.array_equal(m[:4, :4], masks.causal(4)) and not m[:4, 4:].any()
    assert m[4:, :2].all() and not m[4:, 2:4].any() and m[4:, 4:].all()
