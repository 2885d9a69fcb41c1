"""A Hugging Face model directory of the Llama family (Llama 2 and 3, Mistral, Qwen2 / Qwen2.5, Qwen3)."""

from __future__ import annotations

import json
from pathlib import Path

from ..model.config import parse_rope, read_json_object
from .llama_source import LlamaSource, Shape, expected_names

ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
                 "Qwen3ForCausalLM": "qwen3"}
"""What we convert, by ``architectures[0]``: one decoder, Qwen2's with biases on q, k and v (always, in
transformers' Qwen2Attention), Qwen3's with each query and key head RMS-normalised before RoPE."""
ROPE_KEYS = {"yarn": ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor"),
             "llama3": ("low_freq_factor", "high_freq_factor")}
"""The ``rope_parameters`` keys each scaled rope type carries over (besides factor and original context)."""


def _fail(path: Path, msg: str) -> ValueError:
    return ValueError(f"{path}: {msg}")


def read_shape(raw: dict, where: Path) -> Shape:
    """Check a config.json of the Llama family and return its :class:`Shape` (ValueError naming what is off)."""
    arch = (raw.get("architectures") or [None])[0]
    if arch not in ARCHITECTURES:
        raise _fail(where, f"architecture {arch!r} (model_type {raw.get('model_type')!r}) is not supported; "
                           f"supported: {', '.join(ARCHITECTURES)}")
    if raw.get("hidden_act", "silu") != "silu":
        raise _fail(where, f"hidden_act {raw['hidden_act']!r} is not supported (SwiGLU with silu only)")
    for key in ("attention_bias", "mlp_bias"):  # Llama's attention_bias puts one on o_proj too
        if raw.get(key) and not (key == "attention_bias" and arch == "Qwen2ForCausalLM"):
            raise _fail(where, f"{key}=true is not supported (biases on q, k and v only, as Qwen2 has them)")
    if "sliding_attention" in (raw.get("layer_types") or []):
        raise _fail(where, "layer_types has sliding_attention layers, which are not supported (full attention only)")
    window = raw.get("sliding_window")
    if window and raw.get("use_sliding_window", True) and int(window) < int(raw.get("max_position_embeddings", 0)):
        raise _fail(where, f"sliding_window={window} is not supported (full attention only)")
    try:
        parse_rope(raw)  # the checks the checkpoint's loader makes, before anything is converted
    except ValueError as exc:
        raise _fail(where, str(exc).removeprefix("config.json: ")) from None
    rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    theta = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
    missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads") if k not in raw]
    if missing:
        raise _fail(where, f"missing field(s) {', '.join(missing)}")
    heads = int(raw["num_attention_heads"])
    max_pos = int(raw.get("max_position_embeddings", 4096))
    rope_params = {"rope_type": rope_type, "rope_theta": theta, "factor": float(rope.get("factor") or 1.0),
                   "original_max_position_embeddings": int(rope.get("original_max_position_embeddings", max_pos))}
    for k in ROPE_KEYS.get(rope_type, ()):
        if k in rope:
            rope_params[k] = rope[k]
    return Shape(vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
                 intermediate_size=int(raw["intermediate_size"]), num_hidden_layers=int(raw["num_hidden_layers"]),
                 num_attention_heads=heads, num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
                 head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
                 max_position_embeddings=max_pos, rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
                 rope_parameters=rope_params, tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                 attention_bias=arch == "Qwen2ForCausalLM", qk_norm=arch == "Qwen3ForCausalLM")


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(read_json_object(index, "a shard index").get("weight_map", {}).values()))
        files = [path / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise _fail(path, f"shard(s) listed in model.safetensors.index.json are missing: {', '.join(missing)}")
        return files
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    if any(path.glob("*.bin")):
        raise _fail(path, "only PyTorch .bin weights found; save the model as safetensors "
                          "(model.save_pretrained(dir, safe_serialization=True))")
    raise _fail(path, "no model.safetensors nor model.safetensors.index.json")


def _chat_template(path: Path, tok_cfg: dict) -> str | None:
    template = tok_cfg.get("chat_template")
    if isinstance(template, list):
        template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}.get("default")
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text()
    if template is None and (path / "chat_template.json").is_file():
        template = read_json_object(path / "chat_template.json", "a chat template").get("chat_template")
    return template


def _end_of_turn(eos, tokenizer_json: str, template: str | None) -> int | None:
    """The EOS id generation ends a turn with (the others end it too). Of several (Llama 3.1 Instruct:
    ``<|end_of_text|>``, ``<|eom_id|>`` after a tool call, ``<|eot_id|>``), the one the chat template writes
    most often, the token that ends every turn; without a template, or where it writes none of them, the first."""
    if not isinstance(eos, list):
        return eos
    if not eos:
        return None
    text = {t["id"]: t["content"] for t in json.loads(tokenizer_json).get("added_tokens", [])}
    counts = [template.count(text[i]) if template and text.get(i) else 0 for i in eos]
    return eos[counts.index(max(counts))]


def _token_text(v) -> str | None:
    return v.get("content") if isinstance(v, dict) else v if isinstance(v, str) else None


def read_hf_dir(path: Path) -> LlamaSource:
    """Read (lazily, for the weights) a Hugging Face Llama-family model directory."""
    from safetensors import safe_open

    path = Path(path)
    raw = read_json_object(path / "config.json", "model settings") if (path / "config.json").is_file() else None
    if raw is None:
        raise _fail(path, "no config.json: not a Hugging Face model directory")
    if raw.get("architectures") == ["NLDForDiffusionLM"]:
        raise _fail(path, "this is already an NLD checkpoint: pass it as --model directly")
    shape = read_shape(raw, path / "config.json")
    files = _weight_files(path)
    if not (path / "tokenizer.json").is_file():
        raise _fail(path, "no tokenizer.json (a fast tokenizer is needed; tokenizer.model alone is not supported: "
                          "save it with AutoTokenizer.from_pretrained(dir).save_pretrained(dir))")
    tok_cfg = read_json_object(path / "tokenizer_config.json", "tokenizer settings") \
        if (path / "tokenizer_config.json").is_file() else {}
    gen = read_json_object(path / "generation_config.json", "generation settings") \
        if (path / "generation_config.json").is_file() else {}
    all_eos = gen.get("eos_token_id", raw.get("eos_token_id"))
    eos = _end_of_turn(all_eos, (path / "tokenizer.json").read_text(), _chat_template(path, tok_cfg))
    extra_eos = [int(e) for e in all_eos if e != eos] if isinstance(all_eos, list) else []
    if eos is None:
        raise _fail(path, "no eos_token_id in generation_config.json or config.json")
    want = set(expected_names(shape))
    stored: dict[str, Path] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as h:
                for name in h.keys():
                    stored[name] = f
        except Exception as exc:  # a truncated or foreign file must name itself
            raise _fail(f, f"not a readable safetensors file ({exc})") from None
    if shape.tie_word_embeddings:
        stored.pop("lm_head.weight", None)  # some tied checkpoints store the copy anyway
    stored = {k: v for k, v in stored.items() if not k.endswith("rotary_emb.inv_freq")}
    missing, extra = sorted(want - set(stored)), sorted(set(stored) - want)
    if missing or extra:
        raise _fail(path, f"tensors do not match a {raw['architectures'][0]} decoder of this config: "
                          f"missing {missing[:4]}{' …' if len(missing) > 4 else ''}, "
                          f"unexpected {extra[:4]}{' …' if len(extra) > 4 else ''}")

    def tensors():
        by_file: dict[Path, list[str]] = {}
        for name, f in stored.items():
            by_file.setdefault(f, []).append(name)
        for f, names in by_file.items():
            with safe_open(str(f), framework="pt") as h:
                for name in names:
                    yield name, h.get_tensor(name)

    return LlamaSource(
        shape=shape, tensors=tensors, tensor_count=len(stored),
        tokenizer_json=(path / "tokenizer.json").read_text(), chat_template=_chat_template(path, tok_cfg),
        special_tokens={k: t for k in ("bos_token", "eos_token", "pad_token", "unk_token")
                        if (t := _token_text(tok_cfg.get(k))) is not None},
        eos_token_id=int(eos), extra_eos_token_ids=extra_eos, bos_token_id=raw.get("bos_token_id"), pad_token_id=raw.get("pad_token_id"),
        files=[path / "config.json", *files, path / "tokenizer.json"], kind="hf-dir",
        details={"architecture": raw["architectures"][0], "torch_dtype": raw.get("torch_dtype")})
