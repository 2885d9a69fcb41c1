"""Decoders beyond SmolLM2's: Llama 3.1's rope scaling (``rope_type: llama3``) and Qwen2's q/k/v biases.

Each is imported from a Hugging Face directory (the embedded model's weights under that architecture's
config, plus random bf16 biases for Qwen2), and then: our AR greedy output equals transformers' on the
source directory, token for token (near-ties within fidelity's tolerance reported, none expected); every
policy equals our AR, on the native and the torch backends; and the checkpoint converts back to a
directory transformers reads as the same model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from recguide_trt import LLM, EngineConfig, SamplingParams
from recguide_trt.bench import fidelity
from recguide_trt.bench.peers import convert
from recguide_trt.model.backbone import rope_inv_freq
from recguide_trt.model.config import NLDConfig
from recguide_trt.models import import_model
from recguide_trt.models.names import EMBEDDED_MODEL

transformers = pytest.importorskip("transformers")

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
"""Llama 3.1's settings but an original context of 32 tokens, so that the scaling moves most of the
tiny model's 32 frequencies (wavelengths above 32 are divided by 8, those between 8 and 32 interpolated)."""
PROMPTS = [[5, 17, 99, 250], [1, 2000, 31, 7, 7, 7], [400], [12, 900, 45, 3000, 8, 77, 310, 2], [1500, 1501],
           [64, 128, 256, 512, 1024, 2048]]
MAX_TOKENS = 24


def _tiny_as(tmp: Path, name: str, edit) -> Path:
    """The embedded model as a Hugging Face directory, its config changed by ``edit(config, tensors)``."""
    from safetensors.torch import load_file, save_file

    out = convert.to_hf(EMBEDDED_MODEL, tmp / name)
    cfg = json.loads((out / "config.json").read_text())
    tensors = load_file(str(out / "model.safetensors"))
    edit(cfg, tensors)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _llama3(cfg: dict, tensors: dict) -> None:
    cfg["rope_parameters"] = cfg["rope_scaling"] = dict(LLAMA3_ROPE)


def _qwen2(cfg: dict, tensors: dict) -> None:
    cfg.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2", use_sliding_window=False)
    g = torch.Generator().manual_seed(0)
    for i in range(cfg["num_hidden_layers"]):
        for proj in ("q_proj", "k_proj", "v_proj"):
            rows = tensors[f"model.layers.{i}.self_attn.{proj}.weight"].shape[0]
            # bf16 values (the import stores bf16: exact), large enough to move attention
            tensors[f"model.layers.{i}.self_attn.{proj}.bias"] = (torch.randn(rows, generator=g) * 0.5).bfloat16().float()


@pytest.fixture(scope="module", params=["llama3", "qwen2"])
def variant(request, tmp_path_factory) -> tuple[str, Path, Path]:
    """(name, the Hugging Face source directory, its imported checkpoint)."""
    tmp = tmp_path_factory.mktemp(request.param)
    src = _tiny_as(tmp, "hf", {"llama3": _llama3, "qwen2": _qwen2}[request.param])
    return request.param, src, import_model(src, tmp / "nld", progress=False)


def _llm(path: Path, backend: str) -> LLM:
    """``backend``: a backend name, or ``native-bf16`` (bf16 compute and KV cache on the native backend)."""
    bf16 = {"compute_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"} if backend == "native-bf16" else {}
    return LLM(str(path), backend=backend.removesuffix("-bf16"), engine_config=EngineConfig(max_num_seqs=4,
               max_model_len=128), **bf16)


def _generate(llm: LLM, policy: str, **kw) -> list[list[int]]:
    params = SamplingParams(max_tokens=MAX_TOKENS, policy=policy, stop_at_eos=False, **kw)
    return [o.token_ids for o in llm.generate(PROMPTS, params)]


def test_imported_config(variant):
    name, _, ck = variant
    cfg = NLDConfig.from_json(ck / "config.json")
    if name == "llama3":
        assert cfg.rope.rope_type == "llama3" and (cfg.rope.low_freq_factor, cfg.rope.high_freq_factor) == (1.0, 4.0)
        assert cfg.rope.original_max_position_embeddings == 32 and not cfg.attention_bias
    else:
        assert cfg.attention_bias and cfg.rope.rope_type == "default"


def test_llama3_frequencies_are_transformers_own():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=64, rope_parameters=dict(LLAMA3_ROPE))
    theirs, scale = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    cfg = NLDConfig.from_dict({"vocab_size": 8, "hidden_size": 256, "intermediate_size": 8, "num_hidden_layers": 1,
                               "num_attention_heads": 4, "head_dim": 64, "mask_token_id": 3, "eos_token_id": 2,
                               "rope_parameters": dict(LLAMA3_ROPE)})
    ours = rope_inv_freq(cfg.rope, 64)
    assert scale == 1.0 and ours.dtype == torch.float32
    assert torch.equal(ours, theirs)  # bit for bit
    plain = rope_inv_freq(NLDConfig.from_dict({**cfg.to_dict(), "rope_parameters": {"rope_theta": 10000.0}}).rope, 64)
    assert (ours != plain).sum() >= 16  # the scaling moves most frequencies: the test sees it


def test_ar_equals_transformers(variant):
    name, src, ck = variant
    hf_model = fidelity.load_transformers(src)
    assert type(hf_model).__name__ == ("Qwen2ForCausalLM" if name == "qwen2" else "LlamaForCausalLM")
    prompts = [fidelity.Prompt("code", str(p), p) for p in PROMPTS]
    llm = _llm(ck, "native")
    report = fidelity.compare(llm, hf_model, prompts, MAX_TOKENS)
    assert report.ok, report.summary()
    assert report.identical == len(PROMPTS), [r.divergence for r in report.results if not r.identical]
    # The architecture's change matters: the embedded model's own AR differs.
    assert fidelity.run_ours(_llm(EMBEDDED_MODEL, "native"), prompts, MAX_TOKENS) != [r.ours for r in report.results]


@pytest.mark.parametrize("backend", ["native", "native-bf16", "torch"])
def test_every_policy_equals_ar(variant, backend):
    _, _, ck = variant
    llm = _llm(ck, backend)
    ar = _generate(llm, "ar")
    assert _generate(llm, "linearspec", block_size=4) == ar
    assert _generate(llm, "recguide") == ar
    assert _generate(llm, "recguide", block_size=8) == ar


def test_converts_back_to_the_same_model(variant, tmp_path):
    name, src, ck = variant
    back = convert.to_hf(ck, tmp_path / "back")
    assert json.loads((back / "config.json").read_text())["architectures"] == json.loads(
        (src / "config.json").read_text())["architectures"]
    a, b = fidelity.load_transformers(src), fidelity.load_transformers(back)
    ids = torch.tensor([PROMPTS[3]])
    with torch.inference_mode():
        assert torch.equal(a(input_ids=ids).logits, b(input_ids=ids).logits)


def test_refusals_name_the_field(tmp_path):
    def llama_bias(cfg, tensors):
        cfg["attention_bias"] = True

    def bad_llama3(cfg, tensors):
        cfg["rope_parameters"] = cfg["rope_scaling"] = {**LLAMA3_ROPE, "low_freq_factor": 4.0}

    # (Qwen2 without its biases: tests/models/test_import.py, through `recguide import`.)
    for name, edit, needle in (("llama-bias", llama_bias, "attention_bias=true is not supported"),
                               ("bad-llama3", bad_llama3, "low_freq_factor < high_freq_factor")):
        src = _tiny_as(tmp_path, name, edit)
        with pytest.raises(ValueError, match=needle):
            import_model(src, tmp_path / f"{name}-nld", progress=False)
        assert not (tmp_path / f"{name}-nld").exists()
    shutil.rmtree(tmp_path)


def test_onnxruntime_runs_them(variant, tmp_path):
    """The ONNX export (the path to TensorRT) carries the biases."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    name, _, ck = variant
    if name != "qwen2":  # 30 s an export: llama3's frequencies are the same inv_freq buffer the export bakes for any rope
        pytest.skip("the export takes the rope frequencies from the model's inv_freq buffer, whatever the rope type")
    llm = LLM(str(ck), backend="onnxruntime", cache_dir=tmp_path,
              engine_config=EngineConfig(max_num_seqs=4, max_model_len=128))
    ar = _generate(_llm(ck, "torch"), "ar")
    assert _generate(llm, "ar") == ar
    assert _generate(llm, "linearspec", block_size=4) == ar


def test_llama3_chat_template_dates_as_transformers(tmp_path):
    """Llama 3.x's templates ask for ``strftime_now`` (today's date in the system turn), as transformers gives it."""
    from transformers import AutoTokenizer

    from recguide_trt.model.chat_template import load_chat_template

    src = convert.to_hf(EMBEDDED_MODEL, tmp_path / "hf")
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (  # the date logic of Llama 3.2's template, its turns shortened
        "{%- if not date_string is defined %}{%- if strftime_now is defined %}"
        "{%- set date_string = strftime_now(\"%d %b %Y\") %}{%- else %}{%- set date_string = \"26 Jul 2024\" %}"
        "{%- endif %}{%- endif %}{{ bos_token }}Today Date: {{ date_string }}\n"
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}")
    (src / "tokenizer_config.json").write_text(json.dumps(cfg))
    messages = [{"role": "user", "content": "What day is it?"}]
    theirs = AutoTokenizer.from_pretrained(str(src)).apply_chat_template(messages, tokenize=False,
                                                                         add_generation_prompt=True)
    ours = load_chat_template(src)(messages)
    assert ours == theirs and "26 Jul 2024" not in ours


def test_several_eos_ids_stop_at_the_end_of_turn(tmp_path):
    """generation_config.json may list several EOS ids (Llama 3.1 Instruct: end of text, end of a tool call,
    end of turn); the import keeps the one the chat template writes most often, the end of a turn."""
    from recguide_trt.models.hf_dir import read_hf_dir

    src = convert.to_hf(EMBEDDED_MODEL, tmp_path / "hf")  # added tokens <pad> 0, <bos> 1, <eos> 2, <mask> 3
    tok = json.loads((src / "tokenizer_config.json").read_text())
    for eos, template, want in (([1, 2], "{{ bos_token }}{% for m in messages %}{{ m['content'] }}<eos>{% endfor %}<eos>", 2),
                                ([2, 1], "{% for m in messages %}<bos>{{ m['content'] }}<bos>{% endfor %}<eos>", 1),
                                ([1, 2], None, 1)):
        (src / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
        (src / "tokenizer_config.json").write_text(json.dumps({**tok, "chat_template": template}))
        assert read_hf_dir(src).eos_token_id == want, (eos, template)
