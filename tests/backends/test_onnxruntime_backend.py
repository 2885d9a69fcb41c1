"""OnnxRuntimeBackend vs TorchBackend over a sequence of cache-writing forwards; profile rejection."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from recguide_trt.backends.base import ForwardBatch  # noqa: E402
from recguide_trt.backends.onnxruntime_backend import OnnxRuntimeBackend  # noqa: E402
from recguide_trt.backends.torch_backend import TorchBackend  # noqa: E402
from recguide_trt.model import NLDConfig, NLDModel, load_checkpoint, masks, save_checkpoint  # noqa: E402
from recguide_trt.runtime.mismatch import predict_mismatch  # noqa: E402

ASSET = Path(__file__).resolve().parents[2] / "recguide_trt" / "assets" / "nld-tiny"
RTOL, ATOL = 1e-4, 1e-5
SLOTS, CAPACITY = 4, 96


def tiny_checkpoint(path: Path) -> Path:
    cfg = NLDConfig(vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=128, mask_token_id=5,
                    eos_token_id=3, block_size=4)
    model = NLDModel(cfg)
    model.init_weights(seed=3, std=0.2)
    model.attach_draft_adapter(rank=4, alpha=8.0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    return save_checkpoint(model.eval(), path)


@pytest.fixture(scope="module", params=["tiny", "asset"])
def backends(request, tmp_path_factory):
    if request.param == "asset":  # the session's shared export cache of the embedded model (tests/conftest.py)
        ckpt = ASSET
        cache = request.getfixturevalue("embedded_onnx_cache")
    else:
        ckpt = tiny_checkpoint(tmp_path_factory.mktemp("ckpt"))
        cache = tmp_path_factory.mktemp("cache")
    ort_be = OnnxRuntimeBackend(ckpt, SLOTS, CAPACITY, cache_dir=cache)  # exports on the fly
    torch_be = TorchBackend(load_checkpoint(ckpt).model, SLOTS, CAPACITY)
    return ckpt, cache, ort_be, torch_be


def batch(slots, past_lens, ids, pos, intra, gate, want=False) -> ForwardBatch:
    ids = np.asarray(ids, dtype=np.int64)
    B, T = ids.shape
    return ForwardBatch(slots=np.asarray(slots, np.int64), past_lens=np.asarray(past_lens, np.int64),
                        input_ids=ids, position_ids=np.asarray(pos, np.int64),
                        intra_mask=np.broadcast_to(intra, (B, T, T)).copy(),
                        draft_gate=np.broadcast_to(np.asarray(gate, np.float32), (B, T)).copy(),
                        want_logits=np.full(B, want))


def step_sequence(cfg, rng):
    """prefill (ragged, right-padded) -> draft -> verify -> fused -> AR decode, on slots 2 and 0."""
    L, V, M = min(4, cfg.block_size), cfg.vocab_size, cfg.mask_token_id
    slots = [2, 0]
    lens = np.array([9, 6])
    T = 9
    ids = rng.integers(0, V, (2, T))
    yield batch(slots, [0, 0], ids, np.arange(T)[None].repeat(2, 0), masks.causal(T), 0.0, want=True)
    draft_ids = np.full((2, L), M)
    draft_ids[:, 0] = rng.integers(0, V, 2)
    yield batch(slots, lens, draft_ids, lens[:, None] + np.arange(L), masks.draft_block(L), 1.0)
    yield batch(slots, lens, rng.integers(0, V, (2, L)), lens[:, None] + np.arange(L), masks.causal(L), 0.0)
    lens = lens + 2
    fused_ids = np.concatenate([rng.integers(0, V, (2, L + 1)), np.full((2, L - 1), M)], axis=1)
    pos = np.concatenate([lens[:, None] + np.arange(L), lens[:, None] + 2 + np.arange(L)], axis=1)
    gate = np.r_[np.zeros(L), np.ones(L)]
    yield batch(slots, lens, fused_ids, pos, masks.fused_rows(L, 2, L), gate, want=True)
    lens = lens + 3
    for _ in range(3):
        yield batch(slots, lens, rng.integers(0, V, (2, 1)), lens[:, None], masks.causal(1), 0.0)
        lens = lens + 1


def test_sequence_parity_with_torch_backend(backends):
    ckpt, _, ort_be, torch_be = backends
    cfg = torch_be.config
    n = 0
    for fb in step_sequence(cfg, np.random.default_rng(0)):
        got, ref = ort_be.forward(fb), torch_be.forward(fb)
        np.testing.assert_array_equal(got.argmax, ref.argmax)
        np.testing.assert_array_equal(got.top_ids, ref.top_ids)
        # the exported graph scores the first two candidates; the torch backend all three (the draft sampler's)
        np.testing.assert_allclose(got.top_probs, ref.top_probs[..., :2], rtol=RTOL, atol=ATOL)
        assert got.argmax.dtype == got.top_ids.dtype == np.int64 and got.top_probs.dtype == np.float32
        assert (got.logits is None) == (ref.logits is None) == (not fb.want_logits.any())
        if got.logits is not None:
            np.testing.assert_allclose(got.logits, ref.logits, rtol=RTOL, atol=ATOL)
        for b in range(fb.shape[0]):
            pred = predict_mismatch(got.top_ids[b], got.top_probs[b], ort_be.tau, cfg.eos_token_id)
            assert ort_be.last_outputs["flag_pos"][b] == pred.position
            assert ort_be.last_outputs["correction"][b] == pred.correction
        n += 1
    assert n == 7
    end = int(fb.past_lens.max()) + 1
    for layer in range(cfg.num_hidden_layers):
        for slot, length in zip(fb.slots, fb.past_lens + 1):
            np.testing.assert_allclose(ort_be.k_cache[layer][slot, :, :length],
                                       torch_be.k_cache[layer][slot, :, :length].numpy(), rtol=RTOL, atol=ATOL)
            np.testing.assert_allclose(ort_be.v_cache[layer][slot, :, :length],
                                       torch_be.v_cache[layer][slot, :, :length].numpy(), rtol=RTOL, atol=ATOL)
    assert end <= CAPACITY


def test_copy_slot(backends):
    _, _, ort_be, _ = backends
    ort_be.k_cache[0][1, :, :5] = 7.0
    ort_be.copy_slot(1, 3, 5)
    assert (ort_be.k_cache[0][3, :, :5] == 7.0).all()


def test_rejects_out_of_profile_before_running(backends, monkeypatch):
    _, _, ort_be, _ = backends
    man = ort_be.manifest
    before = ort_be.k_cache[0].copy()

    def boom(*a, **k):
        raise AssertionError("session.run must not be called")

    monkeypatch.setattr(ort_be.session, "run", boom)
    too_long = 2 * max(man.block_sizes) + 1
    B = man.profiles["prefill"].batch.max + 1  # too many rows for prefill, too many tokens for verify
    fb = batch([0] * B, [0] * B, np.zeros((B, too_long)), np.zeros((B, too_long)), masks.causal(too_long), 0.0)
    with pytest.raises(ValueError, match=r"outside tokens range \[1, \d+\]"):
        ort_be.forward(fb)
    with pytest.raises(ValueError, match="slot capacity"):
        ort_be.forward(batch([0], [CAPACITY - 1], np.zeros((1, 2)), np.zeros((1, 2)), masks.causal(2), 0.0))
    with pytest.raises(ValueError, match="slot ids"):
        ort_be.forward(batch([SLOTS], [0], np.zeros((1, 2)), np.zeros((1, 2)), masks.causal(2), 0.0))
    np.testing.assert_array_equal(ort_be.k_cache[0], before)


def test_export_cache_is_reused(backends):
    ckpt, cache, ort_be, _ = backends
    entries = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert entries == [ort_be.export_dir]
    stamp = (ort_be.export_dir / "manifest.json").stat().st_mtime_ns
    t0 = time.perf_counter()
    again = OnnxRuntimeBackend(ckpt, 1, 16, cache_dir=cache)
    assert again.export_dir == ort_be.export_dir
    assert (again.export_dir / "manifest.json").stat().st_mtime_ns == stamp
    assert time.perf_counter() - t0 < 10
    # Constructing straight from the export directory works too.
    assert OnnxRuntimeBackend(ort_be.export_dir, 1, 16).manifest == ort_be.manifest


def test_unknown_provider_is_a_clear_error(backends):
    _, _, ort_be, _ = backends
    with pytest.raises(ValueError, match="not available"):
        OnnxRuntimeBackend(ort_be.export_dir, 1, 16, providers=["NoSuchExecutionProvider"])


def test_not_an_export_nor_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError):
        OnnxRuntimeBackend(tmp_path, 1, 16)
