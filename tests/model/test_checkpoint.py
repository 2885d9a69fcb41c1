"""Loading real-layout checkpoints: single/sharded files, adapter, dtype, and clear errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from recguide_trt.model import load_checkpoint, masks, save_checkpoint
from tests.conftest import random_model, tiny_config


def _logits(model, n=12):
    ids = torch.arange(4, 4 + n)[None]
    return model(ids, torch.arange(n)[None], torch.from_numpy(masks.causal(n))[None])[0]


@pytest.mark.parametrize("shards", [1, 3])
def test_round_trip_single_and_sharded(tmp_path, shards):
    model = random_model(tiny_config(hidden_size=48, head_dim=16))
    save_checkpoint(model, tmp_path / "ck", shards=shards)
    if shards > 1:
        assert (tmp_path / "ck" / "model.safetensors.index.json").is_file()
    ck = load_checkpoint(tmp_path / "ck")
    torch.testing.assert_close(_logits(ck.model), _logits(model))
    assert ck.config.q_width == 64 and ck.config.hidden_size == 48


def test_dtypes(tmp_path):
    save_checkpoint(random_model(tiny_config()), tmp_path / "ck")
    for dtype, expect in [("bf16", torch.bfloat16), ("float16", torch.float16), (None, torch.float32)]:
        ck = load_checkpoint(tmp_path / "ck", dtype=dtype)
        assert next(ck.model.parameters()).dtype == expect
    with pytest.raises(ValueError, match="unknown dtype"):
        load_checkpoint(tmp_path / "ck", dtype="int8")


def test_adapter_round_trip(tmp_path):
    model = random_model(tiny_config())
    model.attach_draft_adapter(4, 16.0, ("o_proj", "q_proj"))
    for m in model.modules():
        if getattr(m, "lora_B", None) is not None:
            torch.nn.init.normal_(m.lora_B.weight, std=0.3)
    save_checkpoint(model, tmp_path / "ck")
    cfg = json.loads((tmp_path / "ck" / "linear_spec_lora" / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and sorted(cfg["target_modules"]) == ["o_proj", "q_proj"]
    ck = load_checkpoint(tmp_path / "ck")
    assert ck.model.has_draft_adapter
    ids = torch.arange(4, 12)[None]
    gate = torch.ones(1, 8)
    mask = torch.from_numpy(masks.draft_block(8))[None]
    a = model(ids, torch.arange(8)[None], mask, draft_gate=gate)[0]
    b = ck.model(ids, torch.arange(8)[None], mask, draft_gate=gate)[0]
    torch.testing.assert_close(a, b)


def test_draft_mask_embedding_round_trip(tmp_path):
    model = random_model(tiny_config())
    model.attach_draft_adapter(2, 4.0, ("o_proj",))
    model.attach_draft_mask_embedding()
    with torch.no_grad():
        model.draft_mask_embedding.normal_()
    save_checkpoint(model, tmp_path / "ck")
    assert (tmp_path / "ck" / "linear_spec_lora" / "draft_embedding.safetensors").is_file()
    assert "draft_mask_embedding" not in safe_open(str(tmp_path / "ck" / "model.safetensors"), "pt").keys()
    ck = load_checkpoint(tmp_path / "ck")
    torch.testing.assert_close(ck.model.draft_mask_embedding, model.draft_mask_embedding)
    save_file({"draft_mask_embedding": torch.zeros(3)}, str(tmp_path / "ck" / "linear_spec_lora" /
                                                           "draft_embedding.safetensors"))
    with pytest.raises(ValueError, match="draft_embedding.safetensors.*shape"):
        load_checkpoint(tmp_path / "ck")


@pytest.fixture
def ckpt(tmp_path):
    save_checkpoint(random_model(tiny_config()), tmp_path / "ck")
    return tmp_path / "ck"


def test_missing_directory_and_files(tmp_path, ckpt):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load_checkpoint(ckpt)
    (ckpt / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_checkpoint(ckpt)


def test_missing_shard(tmp_path):
    save_checkpoint(random_model(tiny_config()), tmp_path / "ck", shards=2)
    (tmp_path / "ck" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002"):
        load_checkpoint(tmp_path / "ck")


def test_unknown_model_type(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model_type"] = "llama"
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unknown model_type 'llama'"):
        load_checkpoint(ckpt)


def test_wrong_shape_names_tensor_and_shapes(ckpt):
    tensors = load_file(str(ckpt / "model.safetensors"))
    tensors["encoder.layers.1.self_attn.k_proj.weight"] = torch.zeros(5, 32)
    save_file(tensors, str(ckpt / "model.safetensors"))
    with pytest.raises(ValueError, match=r"encoder\.layers\.1\.self_attn\.k_proj\.weight has shape \(5, 32\).*\(16, 32\)"):
        load_checkpoint(ckpt)


def test_missing_and_unexpected_tensors(ckpt):
    tensors = load_file(str(ckpt / "model.safetensors"))
    del tensors["encoder.norm.weight"]
    tensors["encoder.extra.weight"] = torch.zeros(3)
    save_file(tensors, str(ckpt / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing tensor\(s\): encoder\.norm\.weight.*unexpected tensor\(s\): encoder\.extra"):
        load_checkpoint(ckpt)


def test_mask_token_outside_vocabulary(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["mask_token_id"] = cfg["vocab_size"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="mask_token_id=96 is outside the vocabulary"):
        load_checkpoint(ckpt)


def test_hf_style_config_fields(tmp_path, ckpt):
    """A config written the Ministral-3 way (legacy rope_scaling, eos list) parses."""
    cfg = json.loads((ckpt / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope["rope_theta"]
    cfg["rope_scaling"] = {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 16384,
                           "llama_4_scaling_beta": 0.1}
    cfg["eos_token_id"] = [2, 5]
    cfg["model_type"] = "ministral3"
    out = tmp_path / "hf"
    shutil.copytree(ckpt, out)
    (out / "config.json").write_text(json.dumps(cfg))
    ck = load_checkpoint(out)
    assert ck.config.rope.rope_type == "yarn" and ck.config.rope.llama_4_scaling_beta == 0.1
    assert ck.config.eos_token_id == 2
