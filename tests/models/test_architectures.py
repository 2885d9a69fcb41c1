"""Decoders beyond SmolLM2's: Llama 3.1's rope scaling (``rope_type: llama3``), Qwen2's q/k/v biases and
Qwen3's per-head q/k RMSNorm.

Each is imported from a Hugging Face directory (the embedded model's weights under that architecture's
config, plus random bf16 biases for Qwen2 and random bf16 norm weights for Qwen3), and then: our AR greedy output equals transformers' on the
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


def _qwen3(cfg: dict, tensors: dict) -> None:
    cfg.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", use_sliding_window=False)
    g = torch.Generator().manual_seed(1)
    for i in range(cfg["num_hidden_layers"]):
        for norm in ("q_norm", "k_norm"):  # around 1, as trained norms are, but not 1: the test sees them
            w = 1 + 0.3 * torch.randn(cfg["head_dim"], generator=g)
            tensors[f"model.layers.{i}.self_attn.{norm}.weight"] = w.bfloat16().float()


ARCHS = {"llama3": _llama3, "qwen2": _qwen2, "qwen3": _qwen3}
HF_CLASS = {"llama3": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


@pytest.fixture(scope="module", params=list(ARCHS))
def variant(request, tmp_path_factory) -> tuple[str, Path, Path]:
    """(name, the Hugging Face source directory, its imported checkpoint)."""
    tmp = tmp_path_factory.mktemp(request.param)
    src = _tiny_as(tmp, "hf", ARCHS[request.param])
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
    assert (cfg.rope.rope_type == "llama3") == (name == "llama3")
    assert (cfg.attention_bias, cfg.qk_norm) == (name == "qwen2", name == "qwen3")
    if name == "llama3":
        assert (cfg.rope.low_freq_factor, cfg.rope.high_freq_factor) == (1.0, 4.0)
        assert cfg.rope.original_max_position_embeddings == 32


def test_llama3_rope_from_gguf_factors():
    """Llama 3.1 / 3.2's rope_freqs factors (as convert_hf_to_gguf.py computes them) give back their parameters;
    factors of no llama3 shape are refused, naming the file."""
    from recguide_trt.models.gguf_rope import llama3_factors, llama3_from_factors

    for theta, factor in ((500000.0, 8.0), (500000.0, 32.0)):  # 3.1 8B; 3.2 1B / 3B
        f = llama3_factors(theta, 128, factor, 1.0, 4.0, 8192)
        assert f.dtype == "float32" and f.min() == 1.0 and f.max() == factor and ((f > 1) & (f < factor)).any()
        assert llama3_from_factors(f, theta, 128, "m.gguf") == {
            "rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    odd = llama3_factors(10000.0, 64, 16.0, 2.0, 6.0, 96)  # fitted: low 1 and the same ratios
    p = llama3_from_factors(odd, 10000.0, 64, "m.gguf")
    assert (p["factor"], p["low_freq_factor"], p["high_freq_factor"], p["original_max_position_embeddings"]) == \
        (16.0, 1.0, 3.0, 48)
    bad = odd.copy()
    bad[3] *= 1.5
    for factors in (bad, odd[:-1], -odd):
        with pytest.raises(ValueError, match="m.gguf: rope_freqs"):
            llama3_from_factors(factors, 10000.0, 64, "m.gguf")


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
    assert type(hf_model).__name__ == HF_CLASS[name]
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

    def qwen2_mlp_bias(cfg, tensors):
        _qwen2(cfg, tensors)
        cfg["mlp_bias"] = True

    # (Qwen2 without its biases: tests/models/test_import.py, through `recguide import`.)
    for name, edit, needle in (("llama-bias", llama_bias, "attention_bias=true is not supported"),
                               ("bad-llama3", bad_llama3, "low_freq_factor < high_freq_factor"),
                               ("qwen2-mlp-bias", qwen2_mlp_bias, "mlp_bias=true is not supported")):
        src = _tiny_as(tmp_path, name, edit)
        with pytest.raises(ValueError, match=needle):
            import_model(src, tmp_path / f"{name}-nld", progress=False)
        assert not (tmp_path / f"{name}-nld").exists()
    shutil.rmtree(tmp_path)


def test_onnxruntime_runs_them(tmp_path):
    """The ONNX export (the path to TensorRT) carries q/k/v biases and q/k norms: one export of the
    stand-in's first 2 layers with both (no transformers architecture has both; the backbone takes each on its own flag), and
    llama3's rope, whose frequencies reach the export as the model's inv_freq buffer, as any rope's do."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from safetensors.torch import load_file, save_file

    ck = tmp_path / "both"
    shutil.copytree(EMBEDDED_MODEL, ck, ignore=shutil.ignore_patterns("linear_spec_lora"))
    cfg = json.loads((ck / "config.json").read_text())
    # its first 2 layers (a third of the export's time): every layer exports the same ops
    cfg.update(attention_bias=True, qk_norm=True, rope_parameters=dict(LLAMA3_ROPE), num_hidden_layers=2)
    (ck / "config.json").write_text(json.dumps(cfg))
    tensors = {k: v for k, v in load_file(str(ck / "model.safetensors")).items()
               if not k.startswith("encoder.layers.") or int(k.split(".")[2]) < 2}
    hf = {k.replace("encoder.", "model."): v for k, v in tensors.items()}
    _qwen2(cfg, hf)
    _qwen3(cfg, hf)
    tensors.update({k.replace("model.", "encoder."): v.to(tensors["encoder.norm.weight"].dtype)
                    for k, v in hf.items() if k.endswith(("bias", "_norm.weight"))})
    save_file(tensors, str(ck / "model.safetensors"), metadata={"format": "pt"})
    llm = LLM(str(ck), backend="onnxruntime", cache_dir=tmp_path / "onnx",
              engine_config=EngineConfig(max_num_seqs=4, max_model_len=128))
    ar = _generate(_llm(ck, "torch"), "ar")
    assert _generate(_llm(ck, "native"), "ar") == ar
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


def test_gguf_files_of_them(variant, tmp_path):
    """A ``qwen2`` / ``qwen3`` GGUF file (llama.cpp's layout: NEOX RoPE rows as stored, ``attn_q.bias``,
    ``attn_q_norm``; Qwen2's pre-tokenizer) imports to the Hugging Face directory's checkpoint, and transformers
    reads the same Qwen2 file as the same model and the same tokenizer. A Llama 3.x GGUF (its rope scaling stored
    as llama.cpp's per-dimension ``rope_freqs`` factors) imports with the source's llama3 rope parameters, recovered
    from the factors (here an original context of 32, not Llama 3's 8192: the fitted path)."""
    from recguide_trt.model.checkpoint import load_checkpoint
    from recguide_trt.model.tokenizer import Tokenizer

    name, src, ck = variant
    gguf_path = convert.to_gguf(src, tmp_path / "m.gguf", pre="qwen2")
    out = import_model(gguf_path, tmp_path / "nld", progress=False)
    a, b = load_checkpoint(out, load_adapter=False), load_checkpoint(ck, load_adapter=False)
    assert (a.config.attention_bias, a.config.qk_norm) == (b.config.attention_bias, b.config.qk_norm)
    assert a.config.rope == b.config.rope
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    ours = _generate(_llm(out, "native"), "ar")
    assert ours == _generate(_llm(ck, "native"), "ar")
    if name == "llama3":
        return  # transformers' GGUF reader drops rope_freqs: it would read a plain-RoPE Llama
    import gguf

    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == name)
    canon = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch]}  # llama.cpp's names for the architecture
    for t in gguf.GGUFReader(str(gguf_path)).tensors:
        base = t.name.rsplit(".", 1)[0]
        assert (base.replace(base.split(".")[1], "{bid}", 1) if base.startswith("blk.") else base) in canon, t.name
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name == "qwen3":  # transformers' qwen3 GGUF reader takes head_dim from Qwen3Config's default (128), not
        return           # the file: the stand-in's 64 does not load (real Qwen3 models have 128)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=gguf_path.name, dtype=torch.float32).eval()
    assert type(hf).__name__ == HF_CLASS[name]
    prompts = [fidelity.Prompt("code", str(p), p) for p in PROMPTS]
    eos = a.config.eos_token_id
    theirs, _ = fidelity.run_transformers(hf, prompts, MAX_TOKENS, eos=eos, pad=eos)
    plain = fidelity.run_ours(_llm(out, "native"), prompts, MAX_TOKENS)  # stops at EOS, as generate does
    assert plain == theirs
    tok_theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=gguf_path.name)
    tok_ours = Tokenizer(out / "tokenizer.json")
    for t in ["Hello, world! 12345 tokens", "def f(x):\n    return x**2  # 3.14159\n\n\n", "naïve café — e\u0301 😀",
              "   leading spaces\tand\ttabs", "I'm, you're, they'll; 2026-12-07"]:
        assert tok_ours.encode(t) == tok_theirs.encode(t, add_special_tokens=False), t


def test_every_eos_id_ends_generation(tmp_path):
    """A model with several EOS ids (generation_config.json's list) stops at any of them under every policy, as
    transformers' generate does, and ``min_tokens`` bans them all; the checkpoint keeps the list."""
    src = convert.to_hf(EMBEDDED_MODEL, tmp_path / "hf")
    base = _generate(_llm(EMBEDDED_MODEL, "native"), "ar")
    other = base[0][5]  # a token the model emits at position 5 of the first prompt's answer (not before)
    assert other not in base[0][:5] and other != 2
    (src / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, other]}))
    ck = import_model(src, tmp_path / "nld", progress=False)
    assert json.loads((ck / "config.json").read_text())["eos_token_id"] == [2, other]
    cfg = NLDConfig.from_json(ck / "config.json")
    assert (cfg.eos_token_id, cfg.extra_eos_token_ids) == (2, (other,))
    assert NLDConfig.from_dict(cfg.to_dict()) == cfg
    llm = _llm(ck, "native")
    prompt = [fidelity.Prompt("code", "p0", PROMPTS[0])]
    ours = [llm.generate([PROMPTS[0]], SamplingParams(max_tokens=MAX_TOKENS, policy=p, **kw))[0]
            for p, kw in (("ar", {}), ("linearspec", {"block_size": 4}), ("recguide", {}))]
    assert all(o.token_ids == base[0][:6] and o.finish_reason == "eos" for o in ours), [o.token_ids for o in ours]
    theirs, _ = fidelity.run_transformers(fidelity.load_transformers(src), prompt, MAX_TOKENS, eos=[2, other], pad=0)
    assert theirs[0] == base[0][:6]
    banned = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=10, policy="ar", min_tokens=8))[0].token_ids
    assert other not in banned[:8] and 2 not in banned[:8]
