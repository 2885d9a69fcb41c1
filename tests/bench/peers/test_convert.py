"""The converted Llama checkpoint is our model: same logits and same greedy tokens in transformers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from recguide_trt.bench.peers import convert
from recguide_trt.model import masks
from recguide_trt.model.checkpoint import load_checkpoint
from recguide_trt.models.names import EMBEDDED_MODEL
from tests.conftest import has_embedded

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not has_embedded(), reason="embedded model missing")

PROMPTS = [[5, 77, 301, 1200, 9, 44], [400, 401, 402], list(range(10, 60))]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return convert.to_hf(EMBEDDED_MODEL, tmp_path_factory.mktemp("peers") / "hf-llama")


@pytest.fixture(scope="module")
def hf_model(hf_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32, attn_implementation="eager").eval()


def test_names_map_and_adapter_is_dropped(hf_dir):
    from safetensors import safe_open

    with safe_open(str(hf_dir / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        assert f.get_tensor("lm_head.weight").dtype == torch.float32
    assert "lm_head.weight" in names and "model.embed_tokens.weight" in names and "model.norm.weight" in names
    assert not any(n.startswith("encoder.") or "lora" in n or "diffusion" in n for n in names)
    cfg = json.loads((hf_dir / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["torch_dtype"] == "float32" and cfg["mask_token_id"] == 3


def test_logits_match_our_causal_forward(hf_model):
    ours = load_checkpoint(EMBEDDED_MODEL, dtype="float32", load_adapter=False).model
    for p in PROMPTS:
        T = len(p)
        with torch.inference_mode():
            a, _ = ours(torch.tensor([p]), torch.arange(T)[None], torch.from_numpy(np.asarray(masks.causal(T)))[None])
            b = hf_model(input_ids=torch.tensor([p])).logits
        torch.testing.assert_close(b, a, atol=2e-4, rtol=1e-4)


def test_greedy_tokens_match_our_ar(hf_model):
    from transformers import GenerationConfig

    from recguide_trt import LLM, SamplingParams

    llm = LLM("tiny", backend="torch", max_num_seqs=4)
    ours = [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(max_tokens=12, policy="ar",
                                                                      stop_at_eos=False))]
    hf_model.generation_config.eos_token_id = None
    gc = GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        theirs = [hf_model.generate(input_ids=torch.tensor([p]), generation_config=gc)[0, len(p):].tolist()
                  for p in PROMPTS]
    assert theirs == ours


def test_non_llama_rope_is_refused():
    nld = json.loads((EMBEDDED_MODEL / "config.json").read_text())
    nld["rope_parameters"] = dict(nld["rope_parameters"], rope_type="yarn", factor=4.0)
    with pytest.raises(ValueError, match="not plain Llama RoPE"):
        convert.llama_config(nld)


def test_ortgenai_noeos_copy(tmp_path):
    src = tmp_path / "ortg"
    src.mkdir()
    (src / "model.onnx").write_bytes(b"x")
    (src / "genai_config.json").write_text(json.dumps({"model": {"eos_token_id": 2, "decoder": {}}}))
    out = convert.ortgenai_noeos(src, tmp_path / "noeos", threads=3)
    assert json.loads((out / "genai_config.json").read_text())["model"]["eos_token_id"] == convert.MASK_TOKEN_ID
    assert json.loads((src / "genai_config.json").read_text())["model"]["eos_token_id"] == 2
    assert json.loads((src / "genai_config.json").read_text())["model"]["decoder"]["session_options"] == {
        "intra_op_num_threads": 3, "inter_op_num_threads": 1}
    assert (out / "model.onnx").is_symlink() and (out / "model.onnx").read_bytes() == b"x"


def test_equal_head_is_written_tied_in_the_stored_dtype(tmp_path):
    """An imported model (SmolLM2) stores its tied head as diffusion_head: the HF checkpoint ties it again,
    keeps bf16 with ``source``, and the GGUF reader widens bf16 exactly."""
    from safetensors.torch import save_file

    src = tmp_path / "nld"
    src.mkdir()
    cfg = json.loads((EMBEDDED_MODEL / "config.json").read_text())
    cfg.update(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=1, head_dim=4, mask_token_id=7)
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "tokenizer.json").write_text("{}")
    emb = torch.randn(16, 8).to(torch.bfloat16)
    save_file({"encoder.embed_tokens.weight": emb, "diffusion_head.weight": emb.clone(),
               "encoder.norm.weight": torch.ones(8, dtype=torch.bfloat16)}, str(src / "model.safetensors"))
    out = convert.to_hf(src, tmp_path / "hf", dtype="source")
    hf = json.loads((out / "config.json").read_text())
    assert hf["tie_word_embeddings"] is True and hf["torch_dtype"] == "bfloat16" and hf["mask_token_id"] == 7
    w = convert.load_f32(out / "model.safetensors")
    assert "lm_head.weight" not in w and w["model.embed_tokens.weight"].dtype == np.float32
    np.testing.assert_array_equal(w["model.embed_tokens.weight"], emb.float().numpy())
    fp32 = json.loads((convert.to_hf(src, tmp_path / "hf32") / "config.json").read_text())
    assert fp32["torch_dtype"] == "float32" and fp32["tie_word_embeddings"] is True


def test_ortgenai_noeos_moves_a_pad_that_is_the_eos(tmp_path):
    """SmolLM2 pads with <|im_end|>, which its chat prompts contain: ORT GenAI would mask those tokens."""
    src = tmp_path / "ortg"
    src.mkdir()
    (src / "genai_config.json").write_text(json.dumps({"model": {"eos_token_id": 2, "pad_token_id": 2, "decoder": {}}}))
    out = convert.ortgenai_noeos(src, tmp_path / "noeos", eos_id=16)
    model = json.loads((out / "genai_config.json").read_text())["model"]
    assert model["eos_token_id"] == 16 and model["pad_token_id"] == 16
