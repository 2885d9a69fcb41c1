"""ONNX export: graph I/O, manifest, profile checks and ORT-vs-torch parity in every attention mode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from recguide_trt.engine.export import (  # noqa: E402
    CUSTOM_DOMAIN,
    MISMATCH_OP,
    ensure_export,
    export_onnx,
)
from recguide_trt.engine.manifest import DimRange, ExportManifest, derive_profiles  # noqa: E402
from recguide_trt.model import (  # noqa: E402
    NLDConfig,
    NLDModel,
    RopeConfig,
    load_checkpoint,
    masks,  # noqa: E402
    save_checkpoint,
)
from recguide_trt.runtime.mismatch import predict_mismatch, topk_reference  # noqa: E402

ASSET = Path(__file__).resolve().parents[2] / "recguide_trt" / "assets" / "nld-tiny"
# float32 logits of magnitude ~20 through ONNX Runtime's and torch's kernels differ by a few 1e-5.
RTOL, ATOL = 1e-4, 1e-4
MODE_SEEDS = {"prefill": 0, "draft": 1, "verify": 2, "fused": 3}
TAU = 0.5


def tiny_model(kind: str) -> NLDModel:
    """``wide_q``: hidden 48, 4 heads x 16 (q width 64 != H), draft LoRA with non-zero B.
    ``yarn``: YaRN rope + llama-4 query scaling with a short period, so positions cross it."""
    if kind == "wide_q":
        cfg = NLDConfig(vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                        mask_token_id=5, eos_token_id=3, block_size=8)
    else:
        rope = RopeConfig(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16,
                          llama_4_scaling_beta=0.1)
        cfg = NLDConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=1, head_dim=8, max_position_embeddings=128,
                        rope=rope, mask_token_id=7, eos_token_id=2, block_size=4)
    model = NLDModel(cfg)
    model.init_weights(seed=1, std=0.2)
    if kind == "wide_q":
        model.attach_draft_adapter(rank=4, alpha=8.0)
        gen = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return model.eval()


@pytest.fixture(scope="module", params=["wide_q", "yarn", "asset"])
def exported(request, tmp_path_factory):
    kind = request.param
    if kind == "asset":  # the session's shared export of the embedded model (tests/conftest.py)
        ckpt = ASSET
        out = ensure_export(ASSET, request.getfixturevalue("embedded_onnx_cache"))
    else:
        ckpt = save_checkpoint(tiny_model(kind), tmp_path_factory.mktemp(f"ckpt-{kind}"))
        out = tmp_path_factory.mktemp(f"onnx-{kind}")
        export_onnx(ckpt, out)
    model = load_checkpoint(ckpt).model
    manifest = ExportManifest.load(out)
    session = ort.InferenceSession(str(out / manifest.onnx_file), providers=["CPUExecutionProvider"])
    return kind, model, manifest, session, out


def make_inputs(cfg: NLDConfig, mode: str, rng: np.random.Generator):
    """Inputs of one forward in ``mode``; past K/V random, past lengths differ per row."""
    B = 3
    L = min(4, cfg.block_size)
    P = 0 if mode == "prefill" else 37
    if mode == "prefill":
        T, intra, gate = 7, masks.causal(7), np.zeros(7)
    elif mode == "draft":
        T, intra, gate = L, masks.draft_block(L), np.ones(L)
    elif mode == "verify":
        T, intra, gate = L, masks.causal(L), np.zeros(L)
    else:  # fused: verify row of L + prospective block of L sharing the first 2 verify tokens
        T, intra, gate = 2 * L, masks.fused_rows(L, 2, L), np.r_[np.zeros(L), np.ones(L)]
    past_lens = np.array([P, max(P - 5, 0), max(P - 11, 0)])
    ids = rng.integers(0, cfg.vocab_size, (B, T))
    if mode == "draft":
        ids[:, 1:] = cfg.mask_token_id
    if mode == "fused":
        ids[:, L + 1:] = cfg.mask_token_id
    pos = past_lens[:, None] + np.arange(T)[None, :]
    if mode == "fused":
        pos[:, L:] = past_lens[:, None] + 2 + np.arange(L)[None, :]
    past_valid = np.arange(P)[None, :] < past_lens[:, None]
    mask = np.concatenate([np.broadcast_to(past_valid[:, None, :], (B, T, P)),
                           np.broadcast_to(intra, (B, T, T))], axis=-1)
    past = [(rng.standard_normal((B, cfg.num_key_value_heads, P, cfg.head_dim)).astype(np.float32),
             rng.standard_normal((B, cfg.num_key_value_heads, P, cfg.head_dim)).astype(np.float32))
            for _ in range(cfg.num_hidden_layers)]
    return ids, pos, np.ascontiguousarray(mask), past, np.broadcast_to(gate, (B, T)).astype(np.float32)


def run_both(model, manifest, session, ids, pos, mask, past, gate, tau=TAU):
    feed = {"input_ids": ids, "position_ids": pos, "attention_mask": mask,
            "mismatch_tau": np.array([tau], np.float32)}
    if "draft_gate" in manifest.input_names:
        feed["draft_gate"] = gate
    for i, (k, v) in enumerate(past):
        feed[f"past_key_{i}"], feed[f"past_value_{i}"] = k, v
    got = dict(zip(manifest.output_names, session.run(manifest.output_names, feed)))
    with torch.no_grad():
        logits, present = model(torch.from_numpy(ids), torch.from_numpy(pos), torch.from_numpy(mask),
                                [(torch.from_numpy(k), torch.from_numpy(v)) for k, v in past],
                                torch.from_numpy(np.ascontiguousarray(gate)))
    return got, logits.numpy(), [(k.numpy(), v.numpy()) for k, v in present]


@pytest.mark.parametrize("mode", ["prefill", "draft", "verify", "fused"])
def test_parity_with_torch(exported, mode):
    kind, model, manifest, session, _ = exported
    cfg = model.config
    rng = np.random.default_rng(MODE_SEEDS[mode])  # str hashes change per process
    ids, pos, mask, past, gate = make_inputs(cfg, mode, rng)
    got, logits, present = run_both(model, manifest, session, ids, pos, mask, past, gate)
    np.testing.assert_allclose(got["logits"], logits, rtol=RTOL, atol=ATOL)
    for i, (k, v) in enumerate(present):
        np.testing.assert_allclose(got[f"present_key_{i}"], k, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(got[f"present_value_{i}"], v, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(got["argmax_ids"], logits.argmax(-1))
    ref_ids, ref_probs = topk_reference(logits, cfg.mask_token_id)
    np.testing.assert_array_equal(got["top_ids"], ref_ids)
    np.testing.assert_allclose(got["top_probs"], ref_probs, rtol=RTOL, atol=ATOL)
    assert got["top_ids"].dtype == np.int64 and got["argmax_ids"].dtype == np.int64
    for b in range(ids.shape[0]):
        ref = predict_mismatch(ref_ids[b], ref_probs[b], TAU, cfg.eos_token_id)
        assert (int(got["flag_pos"][b]), int(got["correction"][b])) == (ref.position, ref.correction)


def test_flags_follow_tau(exported):
    """tau is a graph input: tau=1 flags nothing, tau=-1 flags position 1 of every row."""
    kind, model, manifest, session, _ = exported
    ids, pos, mask, past, gate = make_inputs(model.config, "draft", np.random.default_rng(5))
    got, logits, _ = run_both(model, manifest, session, ids, pos, mask, past, gate, tau=1.0)
    assert (got["flag_pos"] == -1).all() and (got["correction"] == -1).all()
    got, logits, _ = run_both(model, manifest, session, ids, pos, mask, past, gate, tau=-1.0)
    assert (got["flag_pos"] == 1).all()
    ref_ids, _ = topk_reference(logits, model.config.mask_token_id)
    eos = model.config.eos_token_id
    want = np.where(ref_ids[:, 1, 1] != eos, ref_ids[:, 1, 1], ref_ids[:, 1, 2])
    np.testing.assert_array_equal(got["correction"], want)


def test_graph_io_and_custom_op(exported):
    import onnx

    kind, model, manifest, session, out = exported
    cfg = model.config
    assert [i.name for i in session.get_inputs()] == manifest.input_names
    assert [o.name for o in session.get_outputs()] == manifest.output_names
    assert ("draft_gate" in manifest.input_names) == model.has_draft_adapter == manifest.has_draft_adapter
    assert manifest.input_names[:3] == ["input_ids", "position_ids", "attention_mask"]
    assert manifest.input_names[3:5] == ["past_key_0", "past_value_0"]
    assert {"present_key_0", "logits", "argmax_ids", "top_ids", "top_probs", "flag_pos",
            "correction"} <= set(manifest.output_names)
    assert manifest.config_fingerprint == cfg.fingerprint()
    assert (manifest.num_layers, manifest.num_kv_heads, manifest.head_dim, manifest.vocab_size) == (
        cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size)
    assert (manifest.mask_token_id, manifest.eos_token_id) == (cfg.mask_token_id, cfg.eos_token_id)
    proto = onnx.load(str(out / manifest.onnx_file), load_external_data=False)
    calls = [n for n in proto.graph.node if n.op_type == MISMATCH_OP]
    assert len(calls) == 1 and calls[0].domain == CUSTOM_DOMAIN
    assert [(f.domain, f.name) for f in proto.functions] == [(CUSTOM_DOMAIN, MISMATCH_OP)]
    assert manifest.custom_ops[0]["op_type"] == MISMATCH_OP
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in proto.graph.input}
    assert dims["past_key_0"] == ["batch", cfg.num_key_value_heads, "past", cfg.head_dim]
    assert (out / manifest.external_data).is_file()


def test_draft_adapter_is_gated(exported):
    kind, model, manifest, session, _ = exported
    if not manifest.has_draft_adapter:
        pytest.skip("checkpoint without draft adapter")
    ids, pos, mask, past, gate = make_inputs(model.config, "draft", np.random.default_rng(3))
    on, _, _ = run_both(model, manifest, session, ids, pos, mask, past, np.ones_like(gate))
    off, logits_off, _ = run_both(model, manifest, session, ids, pos, mask, past, np.zeros_like(gate))
    assert np.abs(on["logits"] - off["logits"]).max() > 1e-3
    np.testing.assert_allclose(off["logits"], logits_off, rtol=RTOL, atol=ATOL)


def test_manifest_profiles(exported, tmp_path):
    kind, model, manifest, session, _ = exported
    hi, lo = max(manifest.block_sizes), min(manifest.block_sizes)
    assert max(manifest.block_sizes) == model.config.block_size
    assert manifest.profiles["draft"].tokens.min == lo and manifest.profiles["draft"].tokens.max == hi
    assert manifest.profiles["verify"].tokens.max == 2 * hi  # fused rows: verify L + prospective L
    assert manifest.profiles["verify"].tokens.min == 1  # AR decode
    assert manifest.max_model_len == model.config.max_position_embeddings
    assert ExportManifest.load(manifest.save(tmp_path)) == manifest


# ------------------------------------------------------------------------------------------------
# Manifest logic without an export
# ------------------------------------------------------------------------------------------------
def _manifest() -> ExportManifest:
    return ExportManifest(
        config_fingerprint="x", weights_key="y", dtype="float32", num_layers=1, num_kv_heads=1, head_dim=2,
        hidden_size=2, vocab_size=4, mask_token_id=0, eos_token_id=1, max_model_len=256, block_sizes=[2, 4, 8],
        has_draft_adapter=False, topk=3, inputs=[], outputs=[],
        profiles=derive_profiles([2, 4, 8], 256, max_batch=16, max_prefill_batch=4, max_prefill_tokens=128))


def test_check_batch_names_the_range():
    m = _manifest()
    m.check_batch((16, 8), 200, "draft")
    m.check_batch((1, 16), 0, "verify")
    with pytest.raises(ValueError, match=r"tokens=9 outside tokens range \[2, 8\]"):
        m.check_batch((2, 9), 10, "draft")
    with pytest.raises(ValueError, match=r"batch=17 outside batch range \[1, 16\]"):
        m.check_batch((17, 4), 10, "verify")
    with pytest.raises(ValueError, match=r"past=300 outside past range"):
        m.check_batch((1, 4), 300, "verify")
    with pytest.raises(ValueError, match="unknown profile"):
        m.check_batch((1, 4), 0, "nope")
    assert m.select_profile((4, 8), 10) == "draft"
    assert m.select_profile((4, 1), 10) == "verify"
    assert m.select_profile((2, 100), 0) == "prefill"
    with pytest.raises(ValueError, match="fits no optimization profile"):
        m.select_profile((5, 100), 0)
    assert ExportManifest.from_dict(m.to_dict()) == m
    with pytest.raises(ValueError):
        DimRange(3, 2, 4)
