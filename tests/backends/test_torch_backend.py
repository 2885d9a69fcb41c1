"""The torch backend's packed forward (rows cost their own tokens) against the padded one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from recguide_trt.backends.base import ForwardBatch
from recguide_trt.backends.torch_backend import TorchBackend
from recguide_trt.model import masks
from tests.conftest import random_model, tiny_config


def _batch(lens: list[int], past: list[int], vocab: int, seed: int = 0) -> ForwardBatch:
    rng = np.random.default_rng(seed)
    B, T = len(lens), max(lens)
    intra = np.zeros((B, T, T), bool)
    intra[:, np.arange(T), np.arange(T)] = True
    gate = np.zeros((B, T), np.float32)
    pos = np.zeros((B, T), np.int64)
    for b, n in enumerate(lens):
        intra[b, :n, :n] = masks.causal(n) if b % 2 == 0 else masks.draft_block(n)
        if b % 2:
            gate[b, :n] = masks.draft_gate(n)
        pos[b, :n] = past[b] + np.arange(n)
        pos[b, n:] = pos[b, n - 1]
    return ForwardBatch(slots=np.arange(B), past_lens=np.array(past), input_ids=rng.integers(4, vocab, (B, T)),
                        position_ids=pos, intra_mask=intra, draft_gate=gate, want_logits=np.ones(B, bool),
                        row_lens=np.array(lens))


def _backend(seed: int = 0) -> TorchBackend:
    cfg = tiny_config()
    model = random_model(cfg, seed=seed)
    model.attach_draft_adapter(rank=4, alpha=8.0, target_modules=("o_proj", "up_proj"))
    return TorchBackend(model, max_slots=8, slot_capacity=64)


def test_packed_outputs_and_cache_match_padded():
    lens, past = [1, 6, 1, 3, 1], [5, 9, 0, 2, 7]
    outs, caches = {}, {}
    for packed in (True, False):
        be = _backend()
        prefix = _batch([10] * 5, [0] * 5, be.vocab_size, seed=1)
        be.forward(dataclasses.replace(prefix, draft_gate=np.zeros_like(prefix.draft_gate),
                                       intra_mask=np.broadcast_to(masks.causal(10), (5, 10, 10)).copy()))
        batch = _batch(lens, past, be.vocab_size, seed=2)
        outs[packed] = be.forward(batch if packed else dataclasses.replace(batch, row_lens=None))
        caches[packed] = [k.clone() for k in be.k_cache]
    a, b = outs[True], outs[False]
    real = np.arange(max(lens))[None] < np.array(lens)[:, None]
    assert np.array_equal(a.argmax[real], b.argmax[real])
    assert np.array_equal(a.top_ids[real], b.top_ids[real])
    np.testing.assert_allclose(a.top_probs[real], b.top_probs[real], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.logits[real], b.logits[real], rtol=1e-5, atol=1e-5)
    assert not a.argmax[~real].any()  # padding outputs are zeros, not stale values
    for row, (n, p) in enumerate(zip(lens, past)):
        for ka, kb in zip(caches[True], caches[False]):
            np.testing.assert_allclose(ka[row, :, :p + n].numpy(), kb[row, :, :p + n].numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("row_lens, match", [([1, 2], r"row_lens has shape"), ([0, 1, 2], r"row_lens must be in"),
                                             ([1, 2, 9], r"row_lens must be in")])
def test_row_lens_validation(row_lens, match):
    be = _backend()
    batch = dataclasses.replace(_batch([1, 2, 3], [0, 0, 0], be.vocab_size), row_lens=np.array(row_lens))
    with pytest.raises(ValueError, match=match):
        be.forward(batch)
