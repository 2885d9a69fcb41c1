"""A llama.cpp GGUF file of the ``llama``, ``qwen2`` or ``qwen3`` architecture, dequantized with the ``gguf``
package.

A ``llama`` file stores Q and K with llama.cpp's interleaved RoPE row order; they are permuted back to the
Hugging Face rotate-half order (the inverse of ``convert_hf_to_gguf.py``'s ``permute``), so the result is
the HF model the file was made from, up to its quantization. ``qwen2`` and ``qwen3`` run llama.cpp's NEOX
(rotate-half) RoPE, so their rows are stored as they are; ``qwen2`` adds q/k/v biases, ``qwen3`` per-head
q/k norms. A Llama 3.x file's rope scaling (``rope_freqs``) is read back as its ``llama3`` parameters (gguf_rope.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .gguf_rope import llama3_from_factors
from .gguf_tokenizer import tokenizer_json
from .llama_source import LlamaSource, Shape, expected_names

TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
"""GGUF tensor types we dequantize."""

ARCHS = {"llama": {"permute_qk": True}, "qwen2": {"attention_bias": True}, "qwen3": {"qk_norm": True}}
"""The GGUF architectures we read, and how each differs from plain Llama."""
LAYER_MAP = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
ROPE_FREQS = "rope_freqs.weight"
"""Llama 3.x's per-dimension rope factors (gguf_rope.py)."""
GLOBAL_MAP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}


def _gguf():
    try:
        import gguf
    except ImportError:
        raise ImportError("reading a .gguf file needs the 'gguf' package: pip install 'recguide-trt[import]' "
                          "(or pip install gguf)") from None
    return gguf


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor name (None when it has no HF counterpart)."""
    if gguf_name in GLOBAL_MAP:
        return GLOBAL_MAP[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] in ("weight", "bias") and parts[2] in LAYER_MAP:
        return f"model.layers.{parts[1]}.{LAYER_MAP[parts[2]]}.{parts[3]}"
    return None


def unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's ``permute(w, n_head)`` of a Q or K weight (interleaved -> rotate-half rows)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_gguf(path: Path) -> LlamaSource:
    gguf = _gguf()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # a truncated or foreign file
        raise ValueError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None

    def field(key: str, default=None):
        f = reader.fields.get(key)
        return f.contents() if f is not None else default

    arch = field("general.architecture")
    if arch not in ARCHS:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported ({', '.join(ARCHS)})")
    kind = ARCHS[arch]

    def meta(key: str, default=None):  # the architecture's own keys: llama.*, qwen2.*, qwen3.*
        return field(f"{arch}.{key}", default)

    heads = int(meta("attention.head_count"))
    kv_heads = int(meta("attention.head_count_kv", heads))
    hidden = int(meta("embedding_length"))
    head_dim = int(meta("attention.key_length", hidden // heads))
    if int(meta("rope.dimension_count", head_dim)) != head_dim:
        raise ValueError(f"{path}: partial rotary embeddings (rope.dimension_count != head_dim) are not supported")
    scaling = meta("rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"{path}: rope scaling {scaling!r} is not supported")
    tokens = field("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError(f"{path}: the GGUF file holds no tokenizer (tokenizer.ggml.tokens)")
    by_name = {t.name: t for t in reader.tensors}
    theta = float(meta("rope.freq_base", 10000.0))
    max_pos = int(meta("context_length", 4096))
    rope = {"rope_type": "default", "rope_theta": theta, "factor": 1.0, "original_max_position_embeddings": max_pos}
    freqs = by_name.pop(ROPE_FREQS, None)  # Llama 3.x's rope scaling: per-dimension factors, not weights
    if freqs is not None:
        factors = np.asarray(gguf.quants.dequantize(freqs.data, freqs.tensor_type), dtype=np.float32)
        if not np.all(factors == 1):
            rope = llama3_from_factors(factors, theta, head_dim, str(path))
    unknown = sorted(n for n in by_name if hf_name(n) is None)
    if unknown:
        raise ValueError(f"{path}: tensors with no Llama counterpart: {', '.join(unknown[:6])}")
    bad = sorted({t.tensor_type.name for t in reader.tensors} - set(TENSOR_TYPES))
    if bad:
        which = next(t.name for t in reader.tensors if t.tensor_type.name in bad)
        raise ValueError(f"{path}: quantization type(s) {', '.join(bad)} (e.g. tensor {which}) are not supported; "
                         f"supported: {', '.join(TENSOR_TYPES)}")
    vocab = int(meta("vocab_size", len(tokens)))
    shape = Shape(vocab_size=vocab, hidden_size=hidden, intermediate_size=int(meta("feed_forward_length")),
                  num_hidden_layers=int(meta("block_count")), num_attention_heads=heads,
                  num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=max_pos,
                  # stored as float32 (9.99999975e-06): the decimal the model was configured with
                  rms_norm_eps=float(f"{float(meta('attention.layer_norm_rms_epsilon', 1e-5)):.7g}"),
                  rope_parameters=rope,
                  tie_word_embeddings="output.weight" not in by_name,
                  attention_bias=kind.get("attention_bias", False), qk_norm=kind.get("qk_norm", False))
    missing = sorted(set(expected_names(shape)) - {hf_name(n) for n in by_name})
    extra = sorted(n for n in by_name if hf_name(n) not in set(expected_names(shape)))
    if missing or extra:
        raise ValueError(f"{path}: tensors do not match a GGUF {arch} decoder of this shape: missing {missing[:4]}, "
                         f"unexpected {extra[:4]}")

    def tensors():
        import torch  # when the weights are read, not for the header's checks (a bad file fails fast)

        for t in reader.tensors:
            if t.name == ROPE_FREQS:
                continue
            name = hf_name(t.name)
            w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
            if kind.get("permute_qk") and t.name.endswith("attn_q.weight"):
                w = unpermute_rope(w, heads)
            elif kind.get("permute_qk") and t.name.endswith("attn_k.weight"):
                w = unpermute_rope(w, kv_heads)
            yield name, torch.from_numpy(np.array(w, dtype=np.float32, order="C"))  # a writable copy

    def special(key: str) -> int | None:
        v = field(f"tokenizer.ggml.{key}_token_id")
        return int(v) if v is not None else None

    eos = special("eot") if special("eot") is not None else special("eos")
    if eos is None:
        raise ValueError(f"{path}: no tokenizer.ggml.eos_token_id")
    ids = {"bos_token": special("bos"), "eos_token": eos, "pad_token": special("padding"), "unk_token": special("unknown")}
    types = {t.tensor_type.name for t in reader.tensors}
    return LlamaSource(
        shape=shape, tensors=tensors, tensor_count=len(by_name),
        tokenizer_json=tokenizer_json(path, field("tokenizer.ggml.model"), field("tokenizer.ggml.pre", "default"),
                                      tokens, field("tokenizer.ggml.token_type"), field("tokenizer.ggml.merges")),
        chat_template=field("tokenizer.chat_template"),
        special_tokens={k: tokens[i] for k, i in ids.items() if i is not None and 0 <= i < len(tokens)},
        eos_token_id=eos, bos_token_id=special("bos"), pad_token_id=special("padding"), files=[path], kind="gguf",
        details={"architecture": arch, "tensor_types": sorted(types), "name": field("general.name")})
