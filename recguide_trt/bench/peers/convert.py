"""An NLD checkpoint (the embedded one, or an imported model) as a plain Llama checkpoint, for engines
that only know Llama.

In causal (AR) mode the NLD backbone is a Llama decoder: ``encoder.*`` -> ``model.*``,
``diffusion_head`` -> ``lm_head`` (or no ``lm_head`` and ``tie_word_embeddings`` when the head equals
the embeddings, as in SmolLM2), the draft adapter (``linear_spec_lora/``) dropped. Weights are cast to
fp32 by default (the embedded model's table; fp32 is what our CPU backends compute in), or kept in the
stored dtype (``--dtype source``: the real model's bf16, which every engine then loads as it would the
original checkpoint). :func:`to_gguf` writes llama.cpp's F32 GGUF from that checkpoint.

Runs as a script in a venv without this package (``setup_peers.sh``)::

    python convert.py hf   SRC_NLD_DIR OUT_HF_DIR [--dtype float32|source]   # needs torch + safetensors
    python convert.py gguf HF_DIR OUT.gguf            # needs numpy + safetensors + gguf
    python convert.py ortg-noeos ORTG_DIR OUT_DIR [--eos-id ID]  # standard library only

Only the standard library is imported at module level.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

MASK_TOKEN_ID = 3
"""``<mask>`` in the embedded model's vocabulary (a checkpoint's own is its config's ``mask_token_id``)."""
SPECIALS = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "mask_token": "<mask>"}


def llama_config(nld: dict, dtype: str = "float32", tied: bool = False) -> dict:
    """The ``config.json`` of the Llama checkpoint (Qwen2's where q, k and v carry biases, Qwen3's where
    queries and keys are normalised per head); refuses RoPE variants Llama cannot express (Llama 3.1's
    llama3 scaling it can).

    ``mask_token_id`` is kept (an extra key every engine ignores): the peer adapters read it as the
    token that is never emitted."""
    rope = nld.get("rope_parameters", {})
    theta = float(rope.get("rope_theta", 10000.0))
    params = {"rope_type": "default", "rope_theta": theta}
    if rope.get("rope_type") == "llama3":
        params = {"rope_type": "llama3", "rope_theta": theta, "factor": float(rope["factor"]),
                  "low_freq_factor": float(rope.get("low_freq_factor", 1.0)),
                  "high_freq_factor": float(rope.get("high_freq_factor", 4.0)),
                  "original_max_position_embeddings": int(rope["original_max_position_embeddings"])}
    elif rope.get("rope_type", "default") != "default" or float(rope.get("factor", 1.0)) != 1.0:
        raise ValueError(f"rope {rope} is not plain Llama RoPE: the converted model would not be the same model")
    if float(rope.get("llama_4_scaling_beta") or 0.0) != 0.0:
        raise ValueError(f"rope {rope} scales queries (llama-4): the converted model would not be the same model")
    if nld.get("attention_bias") and nld.get("qk_norm"):
        raise ValueError("q/k/v biases and q/k norms together: no transformers architecture has both")
    arch = ("Qwen2ForCausalLM", "qwen2") if nld.get("attention_bias") else \
        ("Qwen3ForCausalLM", "qwen3") if nld.get("qk_norm") else ("LlamaForCausalLM", "llama")
    return {
        "architectures": [arch[0]], "model_type": arch[1],
        **{k: nld[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                               "rms_norm_eps", "bos_token_id", "eos_token_id", "pad_token_id")},
        "mask_token_id": nld.get("mask_token_id", MASK_TOKEN_ID),
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1,
        "tie_word_embeddings": tied, "use_cache": True, "attention_dropout": 0.0, "initializer_range": 0.02,
        "torch_dtype": dtype,
        # transformers >= 5 reads rope_parameters; vLLM, CTranslate2 and the GGUF writer read rope_theta.
        "rope_theta": theta, "rope_scaling": None if params["rope_type"] == "default" else params,
        "rope_parameters": params, **({"use_sliding_window": False} if arch[1] != "llama" else {}),
    }


def llama_name(nld_name: str) -> str | None:
    """The Llama tensor name of an NLD tensor, or None for the draft adapter's tensors."""
    if "lora_" in nld_name:
        return None
    if nld_name.startswith("encoder."):
        return "model." + nld_name[len("encoder."):]
    return "lm_head.weight" if nld_name == "diffusion_head.weight" else nld_name


def to_hf(src: Path, out: Path, dtype: str = "float32") -> Path:
    """Write ``out``: config, generation config, ``model.safetensors`` and tokenizer files (the source's
    ``tokenizer_config.json`` where it has one, else the embedded model's special tokens).

    ``dtype``: ``float32`` (weights cast) or ``source`` (the stored dtype). A head equal to the
    embeddings is written as tied embeddings, as the original checkpoint has it."""
    import torch
    from safetensors import safe_open

    from ...model.checkpoint import write_tensors

    if dtype not in ("float32", "source"):
        raise ValueError(f"dtype must be 'float32' or 'source', got {dtype!r}")
    src, out = Path(src), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    nld = json.loads((src / "config.json").read_text())
    tensors = {}
    with safe_open(str(src / "model.safetensors"), framework="pt") as f:
        for key in f.keys():
            name = llama_name(key)
            if name is not None:
                t = f.get_tensor(key)
                tensors[name] = (t if dtype == "source" else t.to(torch.float32)).contiguous()
    head, emb = tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]
    tied = head.shape == emb.shape and bool(torch.equal(head, emb))
    if tied:
        del tensors["lm_head.weight"]
    stored = str(emb.dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(llama_config(nld, stored, tied), indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {k: nld[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")} | {"do_sample": False}, indent=2))
    write_tensors(tensors, out / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(src / "tokenizer.json", out / "tokenizer.json")
    if (src / "tokenizer_config.json").is_file():  # an imported model's own (chat template, its special tokens)
        shutil.copy(src / "tokenizer_config.json", out / "tokenizer_config.json")
        return out
    (out / "special_tokens_map.json").write_text(json.dumps(SPECIALS, indent=2))
    # Prompts are token ids everywhere; the tokenizer files are for engines that insist on loading one.
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "add_eos_token": False,
        "model_max_length": nld["max_position_embeddings"], "clean_up_tokenization_spaces": False, **SPECIALS},
        indent=2))
    return out


def permute_rope(w, n_head: int):
    """HF's rotate-half Q/K rows -> GGUF's interleaved RoPE rows (as llama.cpp's own converter does)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_f32(path: Path) -> dict:
    """Every tensor of a safetensors file as a float32 numpy array (numpy has no bfloat16, so
    ``safetensors.numpy`` cannot read a bf16 checkpoint: BF16 is widened here, exactly)."""
    import numpy as np

    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    types = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
    out = {}
    for name, m in json.loads(raw[8:8 + n]).items():
        if name == "__metadata__":
            continue
        (a, b), dt = m["data_offsets"], np.dtype(types[m["dtype"]])
        t = np.frombuffer(raw, dtype=dt, count=(b - a) // dt.itemsize, offset=8 + n + a).reshape(m["shape"])
        out[name] = (t.astype(np.uint32) << 16).view(np.float32) if m["dtype"] == "BF16" else t.astype(np.float32)
    return out


def to_gguf(hf_dir: Path, out: Path, pre: str = "default") -> Path:
    """Write an F32 GGUF (arch ``llama``, ``qwen2`` or ``qwen3`` as the config's model_type, byte-level BPE
    vocabulary with pre-tokenizer name ``pre``) from the checkpoint :func:`to_hf` wrote. Q and K rows are
    permuted into llama.cpp's interleaved RoPE order for ``llama`` only (the Qwen architectures run NEOX RoPE). A
    Llama's ``llama3`` rope scaling is written as ``convert_hf_to_gguf.py`` writes it: a ``rope_freqs`` tensor."""
    import gguf
    import numpy as np

    from ...models.gguf_file import ROPE_FREQS
    from ...models.gguf_rope import llama3_factors

    hf_dir, out = Path(hf_dir), Path(out)
    cfg = json.loads((hf_dir / "config.json").read_text())
    arch = cfg["model_type"]
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if arch not in ("llama", "qwen2", "qwen3") or rope_type not in ("default", "llama3") or \
            (rope_type == "llama3" and arch != "llama"):
        raise ValueError(f"{hf_dir}: only a Llama (plain or llama3 RoPE), Qwen2 or Qwen3 (plain RoPE) checkpoint is "
                         f"written as GGUF here (this is {arch}, rope {rope})")
    theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    w = load_f32(hf_dir / "model.safetensors")
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    pq, pk = (nh, nkv) if arch == "llama" else (0, 0)  # heads to permute Q and K rows by (0: none)
    g = gguf.GGUFWriter(str(out), arch)
    g.add_name(out.stem.removesuffix("-f32"))
    g.add_context_length(cfg["max_position_embeddings"])
    g.add_embedding_length(cfg["hidden_size"])
    g.add_block_count(cfg["num_hidden_layers"])
    g.add_feed_forward_length(cfg["intermediate_size"])
    g.add_head_count(nh)
    g.add_head_count_kv(nkv)
    g.add_key_length(cfg["head_dim"])
    g.add_value_length(cfg["head_dim"])
    g.add_rope_dimension_count(cfg["head_dim"])
    g.add_rope_freq_base(theta)
    g.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    g.add_vocab_size(cfg["vocab_size"])
    g.add_file_type(gguf.LlamaFileType.ALL_F32)
    by_id = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(cfg["vocab_size"])):
        raise ValueError("tokenizer.json's vocabulary is not the ids 0..vocab_size-1")
    special = {t["id"] for t in tok.get("added_tokens", []) if t.get("special")}
    g.add_tokenizer_model("gpt2")
    g.add_tokenizer_pre(pre)  # llama.cpp's name of the split; prompts are token ids in the peer bench anyway
    g.add_token_list([t for t, _ in by_id])
    g.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for _, i in by_id])
    g.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]])
    g.add_bos_token_id(cfg["bos_token_id"])
    g.add_eos_token_id(cfg["eos_token_id"])
    g.add_pad_token_id(cfg["pad_token_id"])
    g.add_add_bos_token(False)
    g.add_add_eos_token(False)
    if rope_type == "llama3":  # as convert_hf_to_gguf.py writes Llama 3.x's scaling: per-dimension factors
        g.add_tensor(ROPE_FREQS, llama3_factors(
            theta, cfg["head_dim"], float(rope["factor"]), float(rope.get("low_freq_factor", 1.0)),
            float(rope.get("high_freq_factor", 4.0)), int(rope["original_max_position_embeddings"])))
    g.add_tensor("token_embd.weight", w["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for dst, src, heads in (("attn_norm", "input_layernorm", 0), ("attn_q", "self_attn.q_proj", pq),
                                ("attn_k", "self_attn.k_proj", pk), ("attn_v", "self_attn.v_proj", 0),
                                ("attn_output", "self_attn.o_proj", 0), ("ffn_norm", "post_attention_layernorm", 0),
                                ("ffn_gate", "mlp.gate_proj", 0), ("ffn_up", "mlp.up_proj", 0),
                                ("ffn_down", "mlp.down_proj", 0)):
            t = w[p + src + ".weight"]
            g.add_tensor(f"blk.{i}.{dst}.weight", np.ascontiguousarray(permute_rope(t, heads) if heads else t))
            if p + src + ".bias" in w:  # Qwen2's q/k/v
                g.add_tensor(f"blk.{i}.{dst}.bias", w[p + src + ".bias"])
        for norm in ("q_norm", "k_norm"):  # Qwen3's
            if f"{p}self_attn.{norm}.weight" in w:
                g.add_tensor(f"blk.{i}.attn_{norm}.weight", w[f"{p}self_attn.{norm}.weight"])
    g.add_tensor("output_norm.weight", w["model.norm.weight"])
    if "lm_head.weight" in w:  # absent: tied embeddings, which llama.cpp takes as the output too
        g.add_tensor("output.weight", w["lm_head.weight"])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    return out


def ortgenai_noeos(src: Path, out: Path, threads: int = 2, eos_id: int = MASK_TOKEN_ID) -> Path:
    """Pin ONNX Runtime GenAI's export to ``threads`` intra-op threads, and make ``out``: the same
    export (files linked) whose ``genai_config.json`` names ``eos_id`` (the model's ``<mask>``) as EOS.

    ORT-GenAI has no ignore-EOS switch; ``<mask>`` is never emitted by the AR head, so every row
    then decodes exactly the tokens asked for. A pad token equal to the model's EOS (SmolLM2 pads with
    ``<|im_end|>``) becomes ``eos_id`` too: ORT-GenAI masks every prompt token equal to the pad token,
    and chat prompts are full of ``<|im_end|>``.
    """
    src, out = Path(src), Path(out)
    cfg = json.loads((src / "genai_config.json").read_text())
    cfg["model"]["decoder"].setdefault("session_options", {}).update(intra_op_num_threads=threads,
                                                                      inter_op_num_threads=1)
    (src / "genai_config.json").write_text(json.dumps(cfg, indent=4))
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "genai_config.json" and not (out / f.name).exists():
            (out / f.name).symlink_to(f.resolve())
    eos = cfg["model"].get("eos_token_id")
    if cfg["model"].get("pad_token_id") in (eos if isinstance(eos, list) else [eos]):
        cfg["model"]["pad_token_id"] = eos_id
    cfg["model"]["eos_token_id"] = eos_id
    (out / "genai_config.json").write_text(json.dumps(cfg, indent=4))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Convert an NLD checkpoint for the peer engines.")
    ap.add_argument("what", choices=["hf", "gguf", "ortg-noeos"],
                    help="hf: NLD dir -> Llama HF dir; gguf: HF dir -> .gguf; ortg-noeos: ORT-GenAI export -> "
                         "its ignore-EOS copy")
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--dtype", choices=["float32", "source"], default="float32",
                    help="hf: the weights' dtype (default float32; source: as stored, e.g. bf16)")
    ap.add_argument("--eos-id", type=int, default=MASK_TOKEN_ID,
                    help=f"ortg-noeos: the token named as EOS, one never emitted (default {MASK_TOKEN_ID}, the "
                         f"embedded model's <mask>)")
    a = ap.parse_args(argv)
    if a.what == "hf":
        print(to_hf(a.src, a.out, a.dtype))
    elif a.what == "gguf":
        print(to_gguf(a.src, a.out))
    else:
        print(ortgenai_noeos(a.src, a.out, eos_id=a.eos_id))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
