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
    assert cfg["model_type"] == "llama" and cfg["torch_dtype"] == "float32"


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
