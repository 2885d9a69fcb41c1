"""Attention on AMX tiles (bf16 compute + bf16 KV cache, head dimension 64, on CPUs with AMX).

Its arithmetic is bf16 compute's (queries and probabilities rounded to bf16 before their products), one
arithmetic for every shape; its cache keeps the tiles' layouts (keys in panels of dimension pairs, values
as rows of key pairs). These tests pin what that must not break: verify rows equal AR steps bit for bit
where a past is odd (a value pair half cached, half new) and where a block crosses a 32-key chunk, a
prompt gives the same cache and outputs in one forward or two, a copied slot of odd length carries its
last value pair, and the outputs stay within bf16's precision of the float32 path's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recguide_trt.backends.base import ForwardBatch
from recguide_trt.backends.native import build as native_build
from recguide_trt.backends.native_backend import NativeBackend
from tests.conftest import random_model, tiny_config

pytestmark = pytest.mark.skipif(not native_build.load_native().amx_available(), reason="no AMX on this CPU")

BF16 = dict(compute_dtype="bfloat16", kv_cache_dtype="bfloat16")


def _model(seed: int = 11):
    # head_dim 64 (the AMX attention's), GQA 3 query heads per kv head as SmolLM2, 2 layers
    return random_model(tiny_config(hidden_size=192, intermediate_size=256, num_attention_heads=6,
                                    num_key_value_heads=2, head_dim=64, vocab_size=128, max_position_embeddings=512),
                        seed=seed)


def _causal(slot: int, past: int, ids: np.ndarray) -> ForwardBatch:
    n = len(ids)
    return ForwardBatch(slots=np.array([slot]), past_lens=np.array([past]), input_ids=ids[None],
                        position_ids=np.arange(past, past + n)[None], intra_mask=np.tri(n, dtype=bool)[None],
                        draft_gate=np.zeros((1, n), np.float32), want_logits=np.ones(1, bool))


def test_on_only_for_bf16_compute_and_kv_with_head_dim_64(monkeypatch):
    model = _model()
    assert NativeBackend(model, 1, 64, **BF16)._impl.amx_attention()
    assert not NativeBackend(model, 1, 64, compute_dtype="bfloat16")._impl.amx_attention()  # float32 KV
    assert not NativeBackend(model, 1, 64, kv_cache_dtype="bfloat16")._impl.amx_attention()  # float32 compute
    assert not NativeBackend(random_model(tiny_config()), 1, 64, **BF16)._impl.amx_attention()  # head_dim 8
    monkeypatch.setenv("RECGUIDE_NATIVE_AMX_ATTENTION", "0")  # the FMA attention beside AMX GEMMs (A/B)
    fma = NativeBackend(model, 1, 64, **BF16)
    assert not fma._impl.amx_attention() and fma.bf16_dot == "amx_bf16"
    monkeypatch.setenv("RECGUIDE_NATIVE_AMX", "0")
    assert not NativeBackend(model, 1, 64, **BF16)._impl.amx_attention()


@pytest.mark.parametrize("past", [157, 160])
def test_verify_rows_equal_ar_steps_across_odd_pasts_and_chunks(past):
    """Slot 0 decodes 14 tokens one AR step at a time (pasts past..past+13: odd and even, across the
    32-key chunk at 160); slot 1, a copy of the prompt's cache (odd length: the last value pair half
    full), takes the same 14 tokens as one verify row; slot 2 takes them as 5 + 9."""
    model = _model()
    rng = np.random.default_rng(12)
    nb = NativeBackend(model, 3, 200, **BF16)
    nb.forward(_causal(0, 0, rng.integers(4, 128, past)))
    for dst in (1, 2):
        nb.copy_slot(0, dst, past)
    tokens = rng.integers(4, 128, 14)
    ar = np.stack([nb.forward(_causal(0, past + i, tokens[i:i + 1])).logits[0, 0] for i in range(14)])
    row = nb.forward(_causal(1, past, tokens)).logits[0]
    split = np.concatenate([nb.forward(_causal(2, past, tokens[:5])).logits[0, :5],
                            nb.forward(_causal(2, past + 5, tokens[5:])).logits[0, :9]])
    np.testing.assert_array_equal(row, ar)
    np.testing.assert_array_equal(split, ar)
    n = past + 14
    for c in nb.k_cache:  # the same keys in every slot (key panels: whole panels compared)
        assert torch.equal(c[0, :, :(n // 16) * 16 * 64], c[1, :, :(n // 16) * 16 * 64])
        assert torch.equal(c[0, :, :(n // 16) * 16 * 64], c[2, :, :(n // 16) * 16 * 64])
    for c in nb.v_cache:  # values as key pairs: rows [0, n) of the [cap, 64] view are keys [0, n)'s pairs
        assert torch.equal(c[0, :, :n], c[1, :, :n]) and torch.equal(c[0, :, :n], c[2, :, :n])


def test_a_prompt_in_one_forward_or_two():
    """A 75-token prompt in one forward (its new keys' tiles built once per row) or as 37 + 38 (the
    second over an odd past): the same last logits and cache, bit for bit."""
    model = _model(seed=13)
    ids = np.random.default_rng(14).integers(4, 128, 75)
    one, two = NativeBackend(model, 1, 96, **BF16), NativeBackend(model, 1, 96, **BF16)
    a = one.forward(_causal(0, 0, ids)).logits[0, 74]
    two.forward(_causal(0, 0, ids[:37]))
    b = two.forward(_causal(0, 37, ids[37:])).logits[0, 37]
    np.testing.assert_array_equal(a, b)
    for ca, cb in zip(one.k_cache + one.v_cache, two.k_cache + two.v_cache):
        assert torch.equal(ca, cb)


def test_as_close_to_float32_as_the_other_bf16_path(monkeypatch):
    """bf16 compute + KV on AMX (its attention too) against float32 compute and cache: logits within
    bf16's precision, and about as close as the same options on vdpbf16ps with the FMA attention (a
    prompt, then a 9-token verify row over it; 1.08-1.14x that path's error on three random models)."""
    model = _model(seed=15)
    rng = np.random.default_rng(16)
    ids, tokens = rng.integers(4, 128, 90), rng.integers(4, 128, 9)
    outs = []
    for opts, amx in ((BF16, "1"), (BF16, "0"), ({}, "1")):
        monkeypatch.setenv("RECGUIDE_NATIVE_AMX", amx)
        nb = NativeBackend(model, 1, 128, **opts)
        assert nb._impl.amx_attention() == (amx == "1" and bool(opts))
        nb.forward(_causal(0, 0, ids))
        outs.append(nb.forward(_causal(0, 90, tokens)).logits[0])
    amx, dot, f32 = outs
    err_amx, err_dot = np.abs(amx - f32).max(), np.abs(dot - f32).max()
    assert 0 < err_amx < 0.15 * np.abs(f32).max()
    assert err_amx < 1.5 * err_dot
