"""What every source yields: a Llama-family decoder in Hugging Face tensor names, plus its tokenizer.

Sources (a Hugging Face directory, a GGUF file) differ in how they store a model; past this point
they are one thing, which :mod:`.to_nld` writes as an NLD checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only an annotation here: reading a source's header must not wait for torch
    import torch

LAYER_TENSORS = ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                 "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
"""The weights of one Llama decoder layer (``model.layers.{i}.<name>.weight``)."""
BIASED = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
"""The projections with a bias (``.bias``) where :attr:`Shape.attention_bias` is set (Qwen2)."""


@dataclass
class Shape:
    """The shape of a Llama-family decoder."""

    vocab_size: int
    """Rows of the embedding (and of the head)."""
    hidden_size: int
    """Residual width."""
    intermediate_size: int
    """SwiGLU inner width."""
    num_hidden_layers: int
    """Decoder layers."""
    num_attention_heads: int
    """Query heads."""
    num_key_value_heads: int
    """KV heads (GQA)."""
    head_dim: int
    """Per-head width."""
    max_position_embeddings: int
    """Context length the model was trained for."""
    rms_norm_eps: float
    """RMSNorm epsilon."""
    rope_parameters: dict
    """NLD ``rope_parameters`` (``rope_type`` default, yarn or llama3, ``rope_theta``, ...)."""
    tie_word_embeddings: bool
    """The head reuses the embedding (no ``lm_head.weight`` tensor)."""
    attention_bias: bool = False
    """q, k and v carry biases (Qwen2)."""
    qk_norm: bool = False
    """Per-head RMSNorm weights on queries and keys (Qwen3: ``self_attn.q_norm`` / ``k_norm``)."""


@dataclass
class LlamaSource:
    """A Llama-family model read from some source, not yet converted."""

    shape: Shape
    """Its dimensions."""
    tensors: Callable[[], Iterator[tuple[str, torch.Tensor]]]
    """Yields ``(hf_name, tensor)`` pairs (float32 or bf16), one at a time."""
    tensor_count: int
    """How many pairs ``tensors`` yields (for the progress bar)."""
    tokenizer_json: str
    """The ``tokenizer.json`` text (Hugging Face tokenizers)."""
    chat_template: str | None
    """The jinja2 chat template, if the source has one."""
    special_tokens: dict[str, str]
    """``bos_token`` / ``eos_token`` / ``pad_token`` / ``unk_token`` -> token text, as known."""
    eos_token_id: int
    """Where generation stops: the end-of-turn token of chat models."""
    bos_token_id: int | None
    """Beginning-of-sequence token (informational: chat templates place their own)."""
    pad_token_id: int | None
    """Padding token."""
    files: list[Path]
    """The files read, for the provenance record (hashed)."""
    kind: str
    """"hf-dir" or "gguf"."""
    extra_eos_token_ids: list[int] = field(default_factory=list)
    """The source's other EOS ids (generation_config.json's list): they end generation too."""
    details: dict = field(default_factory=dict)
    """Anything else worth recording (quantization types, architecture)."""


def expected_names(shape: Shape) -> list[str]:
    """Every tensor a Llama checkpoint of this shape holds, in HF names."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in range(shape.num_hidden_layers):
        names += [f"model.layers.{i}.{t}.weight" for t in LAYER_TENSORS]
        if shape.attention_bias:
            names += [f"model.layers.{i}.{t}.bias" for t in BIASED]
        if shape.qk_norm:
            names += [f"model.layers.{i}.self_attn.{t}.weight" for t in ("q_norm", "k_norm")]
    if not shape.tie_word_embeddings:
        names.append("lm_head.weight")
    return names
