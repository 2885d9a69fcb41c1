"""The embedded NLD checkpoint as a plain Llama checkpoint, for engines that only know Llama.

In causal (AR) mode the NLD backbone is a Llama decoder: ``encoder.*`` -> ``model.*``,
``diffusion_head`` -> ``lm_head``, the draft adapter (``linear_spec_lora/``) dropped, weights cast
to fp32 (the asset stores bf16; fp32 is what every engine is measured in, and what our CPU
backends compute in). :func:`to_gguf` writes llama.cpp's F32 GGUF from that checkpoint.

Runs as a script in a venv without this package (``setup_peers.sh``)::

    python convert.py hf   SRC_NLD_DIR OUT_HF_DIR     # needs torch + safetensors
    python convert.py gguf HF_DIR OUT.gguf            # needs numpy + safetensors + gguf
    python convert.py ortg-noeos ORTG_DIR OUT_DIR     # standard library only

Only the standard library is imported at module level.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

MASK_TOKEN_ID = 3
"""``<mask>`` in the embedded model's vocabulary."""
SPECIALS = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "mask_token": "<mask>"}


def llama_config(nld: dict) -> dict:
    """The ``config.json`` of the Llama checkpoint; refuses RoPE variants Llama cannot express."""
    rope = nld.get("rope_parameters", {})
    if rope.get("rope_type", "default") != "default" or float(rope.get("factor", 1.0)) != 1.0 \
            or float(rope.get("llama_4_scaling_beta") or 0.0) != 0.0:
        raise ValueError(f"rope {rope} is not plain Llama RoPE: the converted model would not be the same model")
    theta = float(rope.get("rope_theta", 10000.0))
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        **{k: nld[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                               "rms_norm_eps", "bos_token_id", "eos_token_id", "pad_token_id")},
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1,
        "tie_word_embeddings": False, "use_cache": True, "attention_dropout": 0.0, "initializer_range": 0.02,
        "torch_dtype": "float32",
        # transformers >= 5 reads rope_parameters; vLLM, CTranslate2 and the GGUF writer read rope_theta.
        "rope_theta": theta, "rope_scaling": None, "rope_parameters": {"rope_type": "default", "rope_theta": theta},
    }


def llama_name(nld_name: str) -> str | None:
    """The Llama tensor name of an NLD tensor, or None for the draft adapter's tensors."""
    if "lora_" in nld_name:
        return None
    if nld_name.startswith("encoder."):
        return "model." + nld_name[len("encoder."):]
    return "lm_head.weight" if nld_name == "diffusion_head.weight" else nld_name


def to_hf(src: Path, out: Path) -> Path:
    """Write ``out``: config, generation config, fp32 ``model.safetensors`` and tokenizer files (the source's
    ``tokenizer_config.json`` where it has one, else the embedded model's special tokens)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, out = Path(src), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    nld = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(llama_config(nld), indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {k: nld[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")} | {"do_sample": False}, indent=2))
    tensors = {}
    with safe_open(str(src / "model.safetensors"), framework="pt") as f:
        for key in f.keys():
            name = llama_name(key)
            if name is not None:
                tensors[name] = f.get_tensor(key).to(torch.float32).contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
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


def to_gguf(hf_dir: Path, out: Path) -> Path:
    """Write an F32 GGUF (arch ``llama``, byte-level BPE vocabulary) from the checkpoint :func:`to_hf` wrote."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    hf_dir, out = Path(hf_dir), Path(out)
    cfg = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    w = {k: v.astype(np.float32) for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    g = gguf.GGUFWriter(str(out), "llama")
    g.add_name("nld-tiny")
    g.add_context_length(cfg["max_position_embeddings"])
    g.add_embedding_length(cfg["hidden_size"])
    g.add_block_count(cfg["num_hidden_layers"])
    g.add_feed_forward_length(cfg["intermediate_size"])
    g.add_head_count(nh)
    g.add_head_count_kv(nkv)
    g.add_key_length(cfg["head_dim"])
    g.add_value_length(cfg["head_dim"])
    g.add_rope_dimension_count(cfg["head_dim"])
    g.add_rope_freq_base(cfg["rope_theta"])
    g.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    g.add_vocab_size(cfg["vocab_size"])
    g.add_file_type(gguf.LlamaFileType.ALL_F32)
    by_id = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(cfg["vocab_size"])):
        raise ValueError("tokenizer.json's vocabulary is not the ids 0..vocab_size-1")
    special = {t["id"] for t in tok.get("added_tokens", []) if t.get("special")}
    g.add_tokenizer_model("gpt2")
    g.add_tokenizer_pre("default")  # no pre-tokenizer hash lookup: prompts are token ids anyway
    g.add_token_list([t for t, _ in by_id])
    g.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for _, i in by_id])
    g.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]])
    g.add_bos_token_id(cfg["bos_token_id"])
    g.add_eos_token_id(cfg["eos_token_id"])
    g.add_pad_token_id(cfg["pad_token_id"])
    g.add_add_bos_token(False)
    g.add_add_eos_token(False)
    g.add_tensor("token_embd.weight", w["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for dst, src, heads in (("attn_norm", "input_layernorm", 0), ("attn_q", "self_attn.q_proj", nh),
                                ("attn_k", "self_attn.k_proj", nkv), ("attn_v", "self_attn.v_proj", 0),
                                ("attn_output", "self_attn.o_proj", 0), ("ffn_norm", "post_attention_layernorm", 0),
                                ("ffn_gate", "mlp.gate_proj", 0), ("ffn_up", "mlp.up_proj", 0),
                                ("ffn_down", "mlp.down_proj", 0)):
            t = w[p + src + ".weight"]
            g.add_tensor(f"blk.{i}.{dst}.weight", np.ascontiguousarray(permute_rope(t, heads) if heads else t))
    g.add_tensor("output_norm.weight", w["model.norm.weight"])
    g.add_tensor("output.weight", w["lm_head.weight"])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    return out


def ortgenai_noeos(src: Path, out: Path, threads: int = 2) -> Path:
    """Pin ONNX Runtime GenAI's export to ``threads`` intra-op threads, and make ``out``: the same
    export (files linked) whose ``genai_config.json`` names ``<mask>`` as EOS.

    ORT-GenAI has no ignore-EOS switch; ``<mask>`` is never emitted by the AR head, so every row
    then decodes exactly the tokens asked for.
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
    cfg["model"]["eos_token_id"] = MASK_TOKEN_ID
    (out / "genai_config.json").write_text(json.dumps(cfg, indent=4))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Convert the embedded NLD checkpoint for the peer engines.")
    ap.add_argument("what", choices=["hf", "gguf", "ortg-noeos"],
                    help="hf: NLD dir -> Llama HF dir; gguf: HF dir -> .gguf; ortg-noeos: ORT-GenAI export -> "
                         "its ignore-EOS copy")
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    a = ap.parse_args(argv)
    print({"hf": to_hf, "gguf": to_gguf, "ortg-noeos": ortgenai_noeos}[a.what](a.src, a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
