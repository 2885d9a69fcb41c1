"""Attention on bf16 pairs (bf16 compute + bf16 KV cache, head dimension 64): on AMX tiles where the CPU
has AMX, on vdpbf16ps (the dot kernel) where it has AVX512_BF16 only.

Their arithmetic is bf16 compute's (queries and probabilities rounded to bf16 before their products), one
arithmetic for every shape; the cache keeps the tiles' layouts (keys in panels of dimension pairs, values
as rows of key pairs). These tests pin what that must not break, for each kernel: verify rows equal AR
steps bit for bit where a past is odd (a value pair half cached, half new) and where a block crosses a
32-key chunk, a prompt gives the same cache and outputs in one forward or two, a copied slot of odd length
carries its last value pair, draft rows beside others give their own bits, and the outputs stay within
bf16's precision of the float32 path's. The dot kernel runs on every CPU
(``RECGUIDE_NATIVE_BF16_ATTENTION=1`` takes it where vdpbf16ps is emulated), so these never all skip.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recguide_trt.backends.base import ForwardBatch
from recguide_trt.backends.native import build as native_build
from recguide_trt.backends.native_backend import NativeBackend
from tests.conftest import random_model, tiny_config

BF16 = dict(compute_dtype="bfloat16", kv_cache_dtype="bfloat16")
HAS_AMX = native_build.load_native().amx_available()
NATIVE_DOT = native_build.load_native().bf16_dot() == "avx512_bf16" or HAS_AMX


@pytest.fixture(params=["amx_bf16", "dot_bf16"])
def kernel(request, monkeypatch):
    """Each pair kernel in turn: AMX (skipped without it), and the dot kernel (AMX's GEMMs off)."""
    if request.param == "amx_bf16":
        if not HAS_AMX:
            pytest.skip("no AMX on this CPU")
    else:
        monkeypatch.setenv("RECGUIDE_NATIVE_AMX", "0")
        monkeypatch.setenv("RECGUIDE_NATIVE_BF16_ATTENTION", "1")
    return request.param


def _model(seed: int = 11):
    # head_dim 64 (the pair kernels'), GQA 3 query heads per kv head as SmolLM2, 2 layers
    return random_model(tiny_config(hidden_size=192, intermediate_size=256, num_attention_heads=6,
                                    num_key_value_heads=2, head_dim=64, vocab_size=128, max_position_embeddings=512),
                        seed=seed)


def _causal(slot: int, past: int, ids: np.ndarray) -> ForwardBatch:
    n = len(ids)
    return ForwardBatch(slots=np.array([slot]), past_lens=np.array([past]), input_ids=ids[None],
                        position_ids=np.arange(past, past + n)[None], intra_mask=np.tri(n, dtype=bool)[None],
                        draft_gate=np.zeros((1, n), np.float32), want_logits=np.ones(1, bool))


def _kind(nb: NativeBackend) -> str:
    return nb._impl.attention_kind()


def test_which_attention_each_option_and_cpu_takes(monkeypatch):
    model = _model()
    default = "amx_bf16" if HAS_AMX else "dot_bf16" if NATIVE_DOT else "fma"
    assert _kind(NativeBackend(model, 1, 64, **BF16)) == default
    assert _kind(NativeBackend(model, 1, 64, compute_dtype="bfloat16")) == "fma"  # float32 KV
    assert _kind(NativeBackend(model, 1, 64, kv_cache_dtype="bfloat16")) == "fma"  # float32 compute
    assert _kind(NativeBackend(random_model(tiny_config()), 1, 64, **BF16)) == "fma"  # head_dim 8
    monkeypatch.setenv("RECGUIDE_NATIVE_BF16_ATTENTION", "0")  # the FMA attention beside bf16 GEMMs (A/B)
    assert _kind(NativeBackend(model, 1, 64, **BF16)) == "fma"
    monkeypatch.setenv("RECGUIDE_NATIVE_BF16_ATTENTION", "1")  # the dot kernel even where vdpbf16ps is emulated
    monkeypatch.setenv("RECGUIDE_NATIVE_AMX", "0")
    nb = NativeBackend(model, 1, 64, **BF16)
    assert _kind(nb) == "dot_bf16" and not nb._impl.amx_attention()
    if HAS_AMX:
        monkeypatch.delenv("RECGUIDE_NATIVE_AMX")
        monkeypatch.delenv("RECGUIDE_NATIVE_BF16_ATTENTION")
        monkeypatch.setenv("RECGUIDE_NATIVE_AMX_ATTENTION", "0")  # the FMA attention beside AMX GEMMs
        fma = NativeBackend(model, 1, 64, **BF16)
        assert _kind(fma) == "fma" and fma.bf16_dot == "amx_bf16"


@pytest.mark.parametrize("past", [157, 160])
def test_verify_rows_equal_ar_steps_across_odd_pasts_and_chunks(kernel, past):
    """Slot 0 decodes 14 tokens one AR step at a time (pasts past..past+13: odd and even, across the
    32-key chunk at 160); slot 1, a copy of the prompt's cache (odd length: the last value pair half
    full), takes the same 14 tokens as one verify row; slot 2 takes them as 5 + 9."""
    model = _model()
    rng = np.random.default_rng(12)
    nb = NativeBackend(model, 3, 200, **BF16)
    assert _kind(nb) == kernel
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


def test_a_prompt_in_one_forward_or_two(kernel):
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


def test_masked_rows_keep_their_bits_beside_other_rows(kernel):
    """Rows whose intra masks are not causal prefixes (a draft block's) and rows of different lengths and
    pasts in one forward: each row's logits equal those of the same row run alone, bit for bit."""
    model = _model(seed=17)
    rng = np.random.default_rng(18)
    pasts, lens = [45, 130, 7], [9, 3, 16]
    nb = NativeBackend(model, 6, 200, **BF16)
    for slot, p in enumerate(pasts):
        nb.forward(_causal(slot, 0, rng.integers(4, 128, p)))
        nb.copy_slot(slot, slot + 3, p)
    T = max(lens)
    ids = rng.integers(4, 128, (3, T))
    intra = rng.random((3, T, T)) < 0.6
    intra[:, np.arange(T), np.arange(T)] = True
    for b, n in enumerate(lens):
        intra[b, :, n:] = False

    def batch(rows: list[int], slot0: int) -> ForwardBatch:
        Tb = max(lens[b] for b in rows)
        return ForwardBatch(slots=np.array([slot0 + b for b in rows]), past_lens=np.array([pasts[b] for b in rows]),
                            input_ids=ids[rows, :Tb], position_ids=np.array([pasts[b] + np.arange(Tb) for b in rows]),
                            intra_mask=intra[rows][:, :Tb, :Tb], draft_gate=np.zeros((len(rows), Tb), np.float32),
                            want_logits=np.ones(len(rows), bool), row_lens=np.array([lens[b] for b in rows]))

    together = nb.forward(batch([0, 1, 2], 0))
    for b in range(3):
        alone = nb.forward(batch([b], 3))
        np.testing.assert_array_equal(together.logits[b, :lens[b]], alone.logits[0, :lens[b]])


def test_as_close_to_float32_as_the_fma_attention(kernel, monkeypatch):
    """bf16 compute + KV with the pair kernel's attention against float32 compute and cache: logits within
    bf16's precision, and about as close as the same bf16 GEMMs with the FMA attention (a prompt, then a
    9-token verify row over it; AMX: 1.08-1.14x that path's error on three random models)."""
    model = _model(seed=15)
    rng = np.random.default_rng(16)
    ids, tokens = rng.integers(4, 128, 90), rng.integers(4, 128, 9)
    outs = []
    for opts, attention in ((BF16, None), (BF16, "0"), ({}, None)):
        if attention is not None:
            monkeypatch.setenv("RECGUIDE_NATIVE_BF16_ATTENTION", attention)
        nb = NativeBackend(model, 1, 128, **opts)
        assert _kind(nb) == (kernel if opts and attention is None else "fma")
        nb.forward(_causal(0, 0, ids))
        outs.append(nb.forward(_causal(0, 90, tokens)).logits[0])
    pairs, fma, f32 = outs
    err_pairs, err_fma = np.abs(pairs - f32).max(), np.abs(fma - f32).max()
    assert 0 < err_pairs < 0.15 * np.abs(f32).max()
    assert err_pairs < 1.5 * err_fma
