"""The export manifest: what an ONNX export of an NLD checkpoint contains and which shapes it serves.

``manifest.json`` sits next to ``model.onnx`` and is the single source of truth for everything
that consumes the export: the ONNX Runtime backend, the TensorRT engine build
(``python -m recguide_trt.engine.build``) and the TensorRT runtime. It records the model dims,
the graph's input/output names, the custom-op subgraph (``recguide::MismatchPredict``) and the
optimization profiles ``prefill`` / ``draft`` / ``verify`` (min/opt/max of batch, new tokens and
past length), which the TensorRT build turns into engine profiles and which every backend uses
to reject out-of-range batches before running anything.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
PROFILE_ORDER = ("draft", "verify", "prefill")
"""Profiles from the tightest to the widest; :meth:`ExportManifest.select_profile` tries them in order."""


@dataclass
class DimRange:
    """Inclusive ``[min, max]`` range of one dynamic dimension, with the shape to optimize for."""

    min: int
    opt: int
    max: int

    def __post_init__(self) -> None:
        if not 0 <= self.min <= self.opt <= self.max:
            raise ValueError(f"invalid range: need 0 <= min <= opt <= max, got {self.min}/{self.opt}/{self.max}")

    def contains(self, value: int) -> bool:
        return self.min <= value <= self.max

    def __str__(self) -> str:
        return f"[{self.min}, {self.max}]"


@dataclass
class Profile:
    """One optimization profile: ranges of batch rows, new tokens per row and cached past length."""

    batch: DimRange
    tokens: DimRange
    past: DimRange

    def violations(self, batch: int, tokens: int, past: int) -> list[str]:
        out = []
        for name, value, rng in (("batch", batch, self.batch), ("tokens", tokens, self.tokens),
                                 ("past", past, self.past)):
            if not rng.contains(value):
                out.append(f"{name}={value} outside {name} range {rng}")
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Profile:
        return cls(**{k: DimRange(**raw[k]) for k in ("batch", "tokens", "past")})


@dataclass
class TensorSpec:
    """One graph input or output: name, element type and shape (symbolic dims as strings)."""

    name: str
    dtype: str
    shape: list[int | str]


@dataclass
class ExportManifest:
    """Everything a consumer of the export needs to know without opening the ONNX file."""

    config_fingerprint: str
    """``NLDConfig.fingerprint()`` of the exported checkpoint."""
    weights_key: str
    """Hash of the weight files' names, sizes and mtimes (cache key of on-the-fly exports)."""
    dtype: str
    """Element type of the graph's float tensors (K/V, logits, probabilities)."""
    num_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    mask_token_id: int
    eos_token_id: int
    max_model_len: int
    """Longest sequence (cached past + new tokens) the profiles are sized for."""
    block_sizes: list[int]
    """Draft block sizes the profiles were derived from."""
    has_draft_adapter: bool
    """True when the draft LoRA is in the graph; only then does the graph take ``draft_gate``."""
    topk: int
    """Candidates per position in ``top_ids``."""
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    profiles: dict[str, Profile]
    onnx_file: str = "model.onnx"
    external_data: str | None = "model.onnx.data"
    opset: int = 18
    custom_ops: list[dict[str, Any]] = field(default_factory=list)
    """Custom nodes of the graph (domain, op_type, inputs, outputs, attributes, how ORT runs them)."""
    exporter: dict[str, str] = field(default_factory=dict)
    """Versions of the tools that produced the export."""
    format: int = MANIFEST_FORMAT

    # ----------------------------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    def check_batch(self, batch_shape: tuple[int, int], past_len: int, mode: str) -> None:
        """Raise ValueError naming the violated range unless ``(B, T)`` with ``past_len`` fits ``mode``."""
        if mode not in self.profiles:
            raise ValueError(f"unknown profile {mode!r}; this export has {', '.join(self.profiles)}")
        batch, tokens = (int(x) for x in batch_shape)
        bad = self.profiles[mode].violations(batch, tokens, int(past_len))
        if bad:
            raise ValueError(f"batch (B={batch}, T={tokens}, past={past_len}) does not fit the {mode!r} "
                             f"profile: " + "; ".join(bad))

    def select_profile(self, batch_shape: tuple[int, int], past_len: int) -> str:
        """The tightest profile (draft, verify, prefill order) that fits; ValueError naming all ranges."""
        batch, tokens = (int(x) for x in batch_shape)
        reasons = []
        for name in [p for p in PROFILE_ORDER if p in self.profiles] + [
                p for p in self.profiles if p not in PROFILE_ORDER]:
            bad = self.profiles[name].violations(batch, tokens, int(past_len))
            if not bad:
                return name
            reasons.append(f"{name}: " + ", ".join(bad))
        raise ValueError(f"batch (B={batch}, T={tokens}, past={past_len}) fits no optimization profile of "
                         f"this export ({'; '.join(reasons)})")

    # ----------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ExportManifest:
        raw = dict(raw)
        fmt = raw.get("format", MANIFEST_FORMAT)
        if fmt != MANIFEST_FORMAT:
            raise ValueError(f"manifest format {fmt} is not supported (expected {MANIFEST_FORMAT})")
        try:
            raw["inputs"] = [TensorSpec(**t) for t in raw["inputs"]]
            raw["outputs"] = [TensorSpec(**t) for t in raw["outputs"]]
            raw["profiles"] = {k: Profile.from_dict(v) for k, v in raw["profiles"].items()}
            return cls(**raw)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed manifest ({exc})") from None

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / MANIFEST_NAME
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> ExportManifest:
        """Load from a ``manifest.json`` file or the export directory holding it."""
        path = Path(path)
        if path.is_dir():
            path = path / MANIFEST_NAME
        if not path.is_file():
            raise FileNotFoundError(f"no {MANIFEST_NAME} at {path}")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        return cls.from_dict(raw)



def derive_profiles(block_sizes: list[int], max_model_len: int, *, max_batch: int = 64, opt_batch: int = 8,
                    max_prefill_batch: int = 8, max_prefill_tokens: int | None = None,
                    opt_past: int | None = None) -> dict[str, Profile]:
    """Profiles from the supported block sizes and the max model length.

    * ``draft``: one row per request, ``L`` tokens (``[seed, MASK x (L-1)]``): tokens in
      ``[min L, max L]``.
    * ``verify``: AR decode (T=1), verify blocks (T=L) and fused rows, which pack a verify block of
      ``L`` plus a prospective block of ``L`` (2L tokens): tokens in ``[1, 2 max L]``.
    * ``prefill``: prompt chunks of up to ``max_prefill_tokens`` on few rows.

    Past length may be 0 in every profile (a first chunk, a one-token prompt) and reaches
    ``max_model_len`` minus the profile's smallest token count.
    """
    if not block_sizes or min(block_sizes) < 1:
        raise ValueError(f"block sizes must be positive, got {block_sizes}")
    lo, hi = min(block_sizes), max(block_sizes)
    if 2 * hi > max_model_len:
        raise ValueError(f"max block size {hi} (fused rows of {2 * hi} tokens) exceeds max_model_len {max_model_len}")
    max_prefill_tokens = min(max_prefill_tokens or min(max_model_len, 2048), max_model_len)
    opt_past = min(opt_past if opt_past is not None else min(1024, max_model_len // 2), max_model_len - 2 * hi)
    opt_block = sorted(block_sizes)[len(block_sizes) // 2]
    opt_batch = max(1, min(opt_batch, max_batch))
    return {
        "draft": Profile(batch=DimRange(1, opt_batch, max_batch), tokens=DimRange(lo, opt_block, hi),
                         past=DimRange(0, opt_past, max_model_len - lo)),
        "verify": Profile(batch=DimRange(1, opt_batch, max_batch), tokens=DimRange(1, opt_block, 2 * hi),
                          past=DimRange(0, opt_past, max_model_len - 1)),
        "prefill": Profile(batch=DimRange(1, 1, max_prefill_batch),
                           tokens=DimRange(1, min(512, max_prefill_tokens), max_prefill_tokens),
                           past=DimRange(0, 0, max_model_len - 1)),
    }
