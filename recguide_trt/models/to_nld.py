"""Write a :class:`~.llama_source.LlamaSource` as an NLD checkpoint directory.

In AR mode the NLD backbone is this Llama decoder: ``model.*`` becomes ``encoder.*`` and the head
becomes an untied ``diffusion_head`` (a copy of the embedding when the source ties them). The MASK
token is a reserved special token that chat never produces; without a draft adapter it drafts
nothing useful, but AR and verification never read it, so AR output is the source model's.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import torch

from ..model.checkpoint import resolve_dtype, write_tensors
from .llama_source import LlamaSource, expected_names
from .store import sha256_file

DRAFT_BLOCK_SIZE = 8
"""The imported model's default draft block (``block_size`` in config.json)."""


def nld_name(hf_name: str) -> str:
    if hf_name == "lm_head.weight":
        return "diffusion_head.weight"
    return "encoder." + hf_name.removeprefix("model.")


def choose_mask_token(tokenizer_json: str, template: str | None, taken: set[int], requested: str | None) -> int:
    """The MASK id: ``requested`` (token text) if given, else the last reserved special token that is
    neither a role/turn marker in the chat template nor bos/eos/pad/unk."""
    added = json.loads(tokenizer_json).get("added_tokens", [])
    by_text = {t["content"]: t["id"] for t in added}
    if requested is not None:
        if requested not in by_text:
            raise ValueError(f"mask token {requested!r} is not an added token of this tokenizer "
                             f"(added tokens: {', '.join(list(by_text)[:12])} …)")
        return by_text[requested]
    candidates = [t["id"] for t in added if t.get("special") and t["id"] not in taken
                  and not (template and t["content"] in template)]
    if not candidates:
        raise ValueError("the tokenizer has no spare special token to serve as MASK; name one with "
                         "--mask-token (a token the model never produces)")
    return max(candidates)


def write_nld(src: LlamaSource, out: Path, dtype: str = "bfloat16", mask_token: str | None = None,
              provenance: dict | None = None, progress: bool = True) -> Path:
    """Convert ``src`` into the (existing, empty) directory ``out``."""
    from tqdm import tqdm

    torch_dtype = resolve_dtype(dtype)
    shape = src.shape
    # config.json's form of the EOS ids: one, or the list (the end of a turn first) where the source has several
    eos = [src.eos_token_id, *src.extra_eos_token_ids] if src.extra_eos_token_ids else src.eos_token_id
    taken = {i for i in (src.eos_token_id, src.bos_token_id, src.pad_token_id, *src.extra_eos_token_ids)
             if i is not None}
    mask_id = choose_mask_token(src.tokenizer_json, src.chat_template, taken, mask_token)
    tensors: dict[str, torch.Tensor] = {}
    with tqdm(total=src.tensor_count, desc="converting", unit="tensor", disable=not progress) as bar:
        for name, t in src.tensors():
            tensors[nld_name(name)] = t.to(torch_dtype).contiguous()
            bar.update(1)
    missing = sorted(set(map(nld_name, expected_names(shape))) - set(tensors))
    if missing:
        raise ValueError(f"the source lacks tensor(s) {', '.join(missing[:4])}")
    emb = tensors["encoder.embed_tokens.weight"]
    if tuple(emb.shape) != (shape.vocab_size, shape.hidden_size):
        raise ValueError(f"embedding has shape {tuple(emb.shape)}, the config implies "
                         f"{(shape.vocab_size, shape.hidden_size)}")
    if shape.tie_word_embeddings:
        tensors["diffusion_head.weight"] = emb.clone()
    write_tensors(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = {
        "architectures": ["NLDForDiffusionLM"], "model_type": "nld",
        **{k: getattr(shape, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                          "num_attention_heads", "num_key_value_heads", "head_dim",
                                          "max_position_embeddings", "rms_norm_eps", "rope_parameters")},
        "mask_token_id": mask_id, "eos_token_id": eos, "bos_token_id": src.bos_token_id,
        "pad_token_id": src.pad_token_id, "block_size": DRAFT_BLOCK_SIZE,
        **{k: True for k in ("attention_bias", "qk_norm") if getattr(shape, k)},
        # No drafter was trained with this model: the seed runs as an AR step, so d1 is the AR prediction.
        "draft_seed_causal": True, "torch_dtype": str(torch_dtype).removeprefix("torch."),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "tokenizer.json").write_text(src.tokenizer_json)
    # tokenizer_class: transformers' AutoTokenizer (vLLM's benchmark client, peers) then loads tokenizer.json
    # without looking up the checkpoint's model_type, which it does not know.
    tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", **src.special_tokens, "add_bos_token": False,
               "add_eos_token": False, "model_max_length": shape.max_position_embeddings}
    if src.chat_template:
        tok_cfg["chat_template"] = src.chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": eos, "bos_token_id": src.bos_token_id, "pad_token_id": src.pad_token_id,
         "do_sample": False}, indent=2) + "\n")
    record = {
        **(provenance or {}), "kind": src.kind, **src.details,
        "files": [{"name": f.name, "bytes": f.stat().st_size, "sha256": sha256_file(f)} for f in src.files],
        "dtype": str(torch_dtype).removeprefix("torch."),
        "mask_token": {"id": mask_id, "text": _token_text(src.tokenizer_json, mask_id)},
        "imported_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    (out / "provenance.json").write_text(json.dumps(record, indent=2) + "\n")
    return out


def _token_text(tokenizer_json: str, token_id: int) -> str | None:
    for t in json.loads(tokenizer_json).get("added_tokens", []):
        if t["id"] == token_id:
            return t["content"]
    return None


