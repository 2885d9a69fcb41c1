"""NLD model configuration, read from a Hugging Face style ``config.json``."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROPE_TYPES = ("default", "yarn", "llama3")
"""Rotary embeddings the backbone computes (``rope_parameters.rope_type``)."""
# Nemotron-Labs-Diffusion reuses the Ministral-3 text backbone; checkpoints in the wild name it
# either way, and our embedded checkpoint uses "nld".
SUPPORTED_MODEL_TYPES = ("nld", "nemotron_labs_diffusion", "nemotron_diffusion", "ministral3", "mistral3")



def read_json_object(path: Path, what: str = "") -> dict[str, Any]:
    """The JSON object in ``path``; a ValueError naming the file if it is not JSON or not an object
    (``what`` says what the object holds, for the message)."""
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: must be a JSON object{f' of {what}' if what else ''}, got a JSON "
                         f"{'array' if isinstance(raw, list) else type(raw).__name__}")
    return raw

@dataclass
class RopeConfig:
    """Rotary embedding parameters (``rope_parameters`` / legacy ``rope_scaling`` in config.json)."""

    rope_type: str = "default"
    """"default" (plain RoPE), "yarn" or "llama3" (Llama 3.1's frequency-wise scaling)."""
    rope_theta: float = 1_000_000.0
    """Base wavelength."""
    factor: float = 1.0
    """Context-extension factor (YaRN: 16 for NLD; llama3: 8 or 32)."""
    original_max_position_embeddings: int = 16384
    """Pre-extension context length; also the period of the llama-4 query scaling."""
    low_freq_factor: float = 1.0
    """llama3: wavelengths above original_max / low_freq_factor are divided by ``factor``."""
    high_freq_factor: float = 4.0
    """llama3: wavelengths below original_max / high_freq_factor are kept; between the two, interpolated."""
    beta_fast: float = 32.0
    """YaRN extrapolation boundary (rotations)."""
    beta_slow: float = 1.0
    """YaRN interpolation boundary (rotations)."""
    mscale: float | None = 1.0
    """YaRN attention-factor numerator scale."""
    mscale_all_dim: float | None = 1.0
    """YaRN attention-factor denominator scale."""
    attention_factor: float | None = None
    """Explicit cos/sin scale; derived from factor/mscale when absent."""
    truncate: bool = True
    """Round YaRN correction range to whole dimensions."""
    llama_4_scaling_beta: float = 0.0
    """Query scale ``1 + beta*ln(1 + floor(pos/original_max))`` applied after RoPE (0 disables)."""


@dataclass
class NLDConfig:
    """Shape and special tokens of an NLD backbone. Every value comes from config.json."""

    vocab_size: int
    """Rows of the embedding and of the diffusion head."""
    hidden_size: int
    """Residual stream width H."""
    intermediate_size: int
    """SwiGLU inner width."""
    num_hidden_layers: int
    """Decoder layers."""
    num_attention_heads: int
    """Query heads nH."""
    num_key_value_heads: int
    """KV heads (GQA); must divide nH."""
    head_dim: int
    """Per-head width; nH*head_dim may differ from H."""
    max_position_embeddings: int = 4096
    """Longest sequence (prompt + output) the model accepts."""
    rms_norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    rope: RopeConfig = field(default_factory=RopeConfig)
    """Rotary embedding parameters."""
    mask_token_id: int = 100
    """The diffusion MASK token."""
    eos_token_id: int = 11
    """End of sequence (of a chat model: of its turn); generation stops after emitting it."""
    extra_eos_token_ids: tuple[int, ...] = ()
    """Further tokens that end generation as EOS does (config.json's ``eos_token_id`` list after its first:
    Llama 3.1 Instruct's end of text and end of a tool call)."""
    bos_token_id: int | None = 1
    """Prepended to prompts when set."""
    pad_token_id: int | None = None
    """Padding id (never attended)."""
    block_size: int = 32
    """The model's default draft block size."""
    model_type: str = "nld"
    """Architecture tag; one of SUPPORTED_MODEL_TYPES."""
    attention_bias: bool = False
    """The q, k and v projections carry biases (Qwen2's decoder); o_proj and the MLP never do."""
    qk_norm: bool = False
    """Each query and key head is RMS-normalised (weights ``[head_dim]``) before RoPE (Qwen3's decoder)."""
    draft_seed_causal: bool = False
    """Draft-block convention. False (NLD): the seed is drafted like the masks (bidirectional inside
    the block, draft adapter on) and d1 is read at the first MASK. True (the embedded model): the
    seed attends causally with the adapter off, exactly as in AR mode, so its logits are the AR
    prediction and d1 is read there; the masks still see the seed and each other. Must match how
    the checkpoint was trained."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "block_size"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"config.json: {name} must be a positive integer, got {getattr(self, name)!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"config.json: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"config.json: head_dim must be even for RoPE, got {self.head_dim}")
        for name, value in (("mask_token_id", self.mask_token_id), ("eos_token_id", self.eos_token_id),
                            *(("eos_token_id", v) for v in self.extra_eos_token_ids)):
            if not 0 <= value < self.vocab_size:
                raise ValueError(
                    f"config.json: {name}={value} is outside the vocabulary [0, {self.vocab_size})")
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"config.json: unknown model_type {self.model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every token that ends generation as EOS does: ``eos_token_id``, then ``extra_eos_token_ids``."""
        return (self.eos_token_id, *self.extra_eos_token_ids)

    @property
    def q_width(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> NLDConfig:
        # Multimodal Mistral3 wrappers keep the language model under text_config.
        if "text_config" in raw and "hidden_size" not in raw:
            raw = {**raw["text_config"], **{k: v for k, v in raw.items() if k != "text_config"}}
        model_type = raw.get("model_type", "nld")
        if model_type == "mistral3" and "text_config" in raw:
            model_type = raw["text_config"].get("model_type", model_type)
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in raw]
        if missing:
            raise ValueError(f"config.json: missing required field(s): {', '.join(missing)}")
        n_heads = int(raw["num_attention_heads"])
        head_dim = raw.get("head_dim") or int(raw["hidden_size"]) // n_heads
        rope = parse_rope(raw)
        eos = raw.get("eos_token_id", 11)
        extra_eos: list = []
        if isinstance(eos, list):
            if not eos:
                raise ValueError("config.json: eos_token_id is an empty list")
            eos, extra_eos = eos[0], [int(e) for e in eos[1:] if e != eos[0]]
        return cls(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=n_heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or n_heads),
            head_dim=int(head_dim),
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
            rope=rope,
            mask_token_id=int(raw.get("mask_token_id", 100)),
            eos_token_id=int(eos),
            extra_eos_token_ids=tuple(dict.fromkeys(extra_eos)),
            bos_token_id=raw.get("bos_token_id"),
            pad_token_id=raw.get("pad_token_id"),
            block_size=int(raw.get("block_size", 32)),
            model_type=model_type,
            attention_bias=bool(raw.get("attention_bias", False)),
            qk_norm=bool(raw.get("qk_norm", False)),
            draft_seed_causal=bool(raw.get("draft_seed_causal", False)),
        )

    @classmethod
    def from_json(cls, path: str | Path) -> NLDConfig:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no config.json at {path}")
        raw = read_json_object(path, "model settings")
        for key in INTEGER_FIELDS:
            v = raw.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"{path}: {key} must be a non-negative integer, got {v!r}")
        try:
            return cls.from_dict(raw)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise ValueError(f"{path}: {str(exc).removeprefix('config.json: ')}") from None

    def to_dict(self) -> dict[str, Any]:
        """The config.json form (Ministral-3 field names, rope under ``rope_parameters``)."""
        out = asdict(self)
        rope = out.pop("rope")
        # Fields added later are written only where they matter, so a config without them keeps its
        # fingerprint (the key of exported engines and cached cost tables) and its file.
        if rope["rope_type"] != "llama3":
            del rope["low_freq_factor"], rope["high_freq_factor"]
        for key in ("attention_bias", "qk_norm"):
            if not out[key]:
                del out[key]
        if out.pop("extra_eos_token_ids"):  # as Hugging Face writes several: one list, the end of a turn first
            out["eos_token_id"] = list(self.eos_token_ids)
        out["rope_parameters"] = rope
        out["architectures"] = ["NLDForDiffusionLM"]
        return out

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def fingerprint(self) -> str:
        """Stable short hash of the config, for caches and manifests."""
        import hashlib

        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def parse_rope(raw: dict[str, Any]) -> RopeConfig:
    """The rotary embedding of a config.json (``rope_parameters``, or the legacy ``rope_scaling`` with
    ``rope_theta`` beside it), checked: a ValueError names what is off."""
    rope_raw = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    rope_type = rope_raw.get("rope_type") or rope_raw.get("type") or "default"
    rope = RopeConfig(
        rope_type=rope_type,
        rope_theta=float(rope_raw.get("rope_theta", raw.get("rope_theta", 1_000_000.0))),
        factor=float(rope_raw.get("factor") or 1.0),
        original_max_position_embeddings=int(rope_raw.get(
            "original_max_position_embeddings", raw.get("original_max_position_embeddings", 16384))),
        beta_fast=float(rope_raw.get("beta_fast") or 32.0),
        beta_slow=float(rope_raw.get("beta_slow") or 1.0),
        mscale=rope_raw.get("mscale"),
        mscale_all_dim=rope_raw.get("mscale_all_dim"),
        attention_factor=rope_raw.get("attention_factor"),
        truncate=bool(rope_raw.get("truncate", True)),
        llama_4_scaling_beta=float(rope_raw.get("llama_4_scaling_beta",
                                                raw.get("llama_4_scaling_beta", 0.0)) or 0.0),
        low_freq_factor=float(rope_raw.get("low_freq_factor", 1.0)),
        high_freq_factor=float(rope_raw.get("high_freq_factor", 4.0)),
    )
    if rope.rope_type not in ROPE_TYPES:
        raise ValueError(f"config.json: unsupported rope type {rope.rope_type!r} (supported: "
                         f"{', '.join(ROPE_TYPES)})")
    if rope.rope_type == "llama3" and not (0 < rope.low_freq_factor < rope.high_freq_factor and rope.factor > 0):
        raise ValueError(f"config.json: llama3 rope needs factor > 0 and 0 < low_freq_factor < high_freq_factor, "
                         f"got {rope.factor}, {rope.low_freq_factor} and {rope.high_freq_factor}")
    return rope


INTEGER_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "max_position_embeddings", "mask_token_id", "block_size")
"""config.json fields that must be integers (checked so the message names the field, not int()'s argument)."""


def yarn_attention_factor(rope: RopeConfig) -> float:
    """cos/sin scale of YaRN (1.0 for plain RoPE)."""
    if rope.rope_type != "yarn":
        return 1.0
    if rope.attention_factor is not None:
        return float(rope.attention_factor)

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rope.mscale and rope.mscale_all_dim:
        return get_mscale(rope.factor, rope.mscale) / get_mscale(rope.factor, rope.mscale_all_dim)
    return get_mscale(rope.factor)
