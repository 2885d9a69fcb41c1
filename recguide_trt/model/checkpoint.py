"""Load and save NLD checkpoints in the Hugging Face layout.

A checkpoint directory holds ``config.json``, ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``), ``tokenizer.json`` and optionally the draft adapter
``linear_spec_lora/`` (PEFT format: ``adapter_config.json`` + ``adapter_model.safetensors``, and
``draft_embedding.safetensors`` where the adapter has a draft MASK embedding).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..cache import permissions_as_umask
from .backbone import NLDModel, is_adapter_key, rope_inv_freq
from .config import NLDConfig, read_json_object
from .draft_sampler import DraftSamplerWeights, sampler_weights_from
from .tokenizer import Tokenizer


def write_tensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """safetensors' ``save_file``, the file then given the umask's mode (``save_file`` makes it 0600)."""
    save_file(tensors, str(path), metadata=metadata)
    permissions_as_umask(path)


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
ADAPTER_DIR = "linear_spec_lora"
DRAFT_EMBEDDING_FILE = "draft_embedding.safetensors"
"""The draft MASK embedding beside the PEFT files (``NLDModel.draft_mask_embedding``)."""
DRAFT_SAMPLER_FILE = "draft_sampler.safetensors"
"""The draft sampler beside them (:mod:`.draft_sampler`): read with the adapter, used by the engine's drafts."""
PEFT_PREFIX = "base_model.model."


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype {dtype} is not supported; use float32, bfloat16 or float16")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(sorted(DTYPES))}")
    return DTYPES[dtype]


@dataclass
class Checkpoint:
    """What a checkpoint directory holds, loaded."""

    model: NLDModel
    """The backbone, weights loaded, in eval mode."""
    config: NLDConfig
    """Parsed config.json."""
    tokenizer: Tokenizer | None
    """From tokenizer.json, or None when the directory has none."""
    path: Path
    """The directory it came from."""
    draft_sampler: DraftSamplerWeights | None = None
    """The adapter's draft sampler, where its directory has one (and the adapter was loaded)."""


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise ValueError(f"{index}: malformed index ({exc})") from None
        files = sorted({path / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{path}: shard(s) listed in the index are missing: {', '.join(missing)}")
        return files
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    raise FileNotFoundError(f"{path}: no model.safetensors nor model.safetensors.index.json")


def _read_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as handle:
                for name in handle.keys():
                    tensors[name] = handle.get_tensor(name)
        except Exception as exc:  # SafetensorError, OSError, ...: a damaged file must say which file it is
            size = f.stat().st_size if f.is_file() else 0
            raise ValueError(f"{f}: not a readable safetensors file ({size} bytes; {exc}): re-download or "
                             f"re-save it") from None
    return tensors


def _check_and_assign(module: torch.nn.Module, tensors: dict[str, torch.Tensor], where: str,
                      dtype: torch.dtype, prefix_filter: str = "") -> None:
    expected = {k: v for k, v in module.state_dict().items() if k.startswith(prefix_filter)}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensor(s): {', '.join(missing[:8])}{' …' if len(missing) > 8 else ''}")
        if unexpected:
            parts.append(f"unexpected tensor(s): {', '.join(unexpected[:8])}{' …' if len(unexpected) > 8 else ''}")
        raise ValueError(f"{where}: " + "; ".join(parts))
    for name, ref in expected.items():
        got = tensors[name]
        if tuple(got.shape) != tuple(ref.shape):
            raise ValueError(f"{where}: tensor {name} has shape {tuple(got.shape)}, "
                             f"the config implies {tuple(ref.shape)}")
    params = dict(module.named_parameters())
    with torch.no_grad():
        for name in expected:
            params[name].copy_(tensors[name].to(dtype))


def stored_dtype(path: str | Path) -> torch.dtype | None:
    """The dtype every base weight of a checkpoint is stored in (from the files' headers); None if mixed or
    unreadable (:func:`load_checkpoint` then says what is wrong with the files)."""
    dtypes = set()
    try:
        for f in _weight_files(Path(path)):
            with safe_open(str(f), "pt") as h:
                for name in h.keys():
                    dtypes.add(h.get_slice(name).get_dtype())
    except Exception:  # a damaged or missing file: the loader's own error names it
        return None
    names = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}
    return names.get(dtypes.pop()) if len(dtypes) == 1 else None


def load_checkpoint(path: str | Path, dtype: str | torch.dtype | None = None,
                    device: str | torch.device = "cpu", load_adapter: bool = True) -> Checkpoint:
    """Load config, weights, tokenizer and (when present) the draft adapter of a checkpoint dir."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    if not path.is_dir():
        raise NotADirectoryError(f"checkpoint path {path} is not a directory")
    config = NLDConfig.from_json(path / "config.json")
    torch_dtype = resolve_dtype(dtype)
    with torch.device("meta"):
        model = NLDModel(config)
    model = model.to_empty(device=device).to(torch_dtype)
    # Buffers built on the meta device carry no values.
    model.inv_freq = rope_inv_freq(config.rope, config.head_dim).to(device)
    _check_and_assign(model, _read_tensors(_weight_files(path)), str(path), torch_dtype)
    adapter = path / ADAPTER_DIR
    sampler = None
    if load_adapter and adapter.is_dir():
        load_draft_adapter(model, adapter, torch_dtype)
        sampler = load_draft_sampler(adapter, config.hidden_size)
    tokenizer = None
    if (path / "tokenizer.json").is_file():
        tokenizer = Tokenizer(path / "tokenizer.json")
        if config.mask_token_id >= tokenizer.vocab_size and tokenizer.vocab_size > config.vocab_size:
            raise ValueError(f"{path}: mask_token_id {config.mask_token_id} is outside the tokenizer vocabulary")
    model.eval()
    return Checkpoint(model=model, config=config, tokenizer=tokenizer, path=path, draft_sampler=sampler)


def load_draft_sampler(adapter_dir: Path, hidden_size: int) -> DraftSamplerWeights | None:
    """The draft sampler of an adapter directory (None where it has none), its shapes checked."""
    f = adapter_dir / DRAFT_SAMPLER_FILE
    if not f.is_file():
        return None
    weights = sampler_weights_from({k: v.float().numpy() for k, v in _read_tensors([f]).items()}, str(f))
    weights.check(hidden_size, str(f))
    return weights


def save_draft_sampler(weights: DraftSamplerWeights, adapter_dir: str | Path) -> Path:
    """Write a draft sampler beside an adapter (float32: it is a few hundred thousand numbers)."""
    f = Path(adapter_dir) / DRAFT_SAMPLER_FILE
    write_tensors({k: torch.from_numpy(getattr(weights, k)).contiguous() for k in weights.__dataclass_fields__}, str(f))
    return f


def read_adapter_config(adapter_dir: Path) -> tuple[int, float, list[str]]:
    """A draft adapter's PEFT settings: rank, alpha and target projections (PEFT's defaults where absent)."""
    cfg_path = adapter_dir / "adapter_config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{adapter_dir}: missing adapter_config.json")
    acfg = read_json_object(cfg_path, "PEFT LoRA settings")
    try:
        rank, alpha = int(acfg.get("r", 8)), float(acfg.get("lora_alpha", acfg.get("r", 8)))
    except (TypeError, ValueError):
        raise ValueError(f"{cfg_path}: 'r' must be an integer and 'lora_alpha' a number, got r={acfg.get('r')!r}, "
                         f"lora_alpha={acfg.get('lora_alpha')!r}") from None
    targets = acfg.get("target_modules") or ["o_proj"]
    if isinstance(targets, str):
        targets = [targets]
    return rank, alpha, list(targets)


def load_draft_adapter(model: NLDModel, adapter_dir: Path, dtype: torch.dtype) -> None:
    rank, alpha, targets = read_adapter_config(adapter_dir)
    weights = adapter_dir / "adapter_model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"{adapter_dir}: missing adapter_model.safetensors")
    model.attach_draft_adapter(rank, alpha, tuple(targets))
    for module in model.modules():  # the new LoRA layers only: inv_freq stays float32, as transformers keeps it
        if getattr(module, "lora_A", None) is not None:
            module.lora_A.to(dtype)
            module.lora_B.to(dtype)
    tensors = {k.removeprefix(PEFT_PREFIX).replace(".lora_A.default.", ".lora_A.")
               .replace(".lora_B.default.", ".lora_B."): v for k, v in _read_tensors([weights]).items()}
    own = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    if missing or unexpected:
        raise ValueError(f"{adapter_dir}: adapter tensors do not match target_modules {targets}: "
                         f"missing {missing[:4]}, unexpected {unexpected[:4]}")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, ref in own.items():
            if tuple(tensors[name].shape) != tuple(ref.shape):
                raise ValueError(f"{adapter_dir}: tensor {name} has shape {tuple(tensors[name].shape)}, "
                                 f"expected {tuple(ref.shape)}")
            params[name].copy_(tensors[name].to(dtype))
    embedding = adapter_dir / DRAFT_EMBEDDING_FILE
    if embedding.is_file():
        row = _read_tensors([embedding]).get("draft_mask_embedding")
        if row is None or tuple(row.shape) != (model.config.hidden_size,):
            raise ValueError(f"{embedding}: expected one tensor 'draft_mask_embedding' of shape "
                             f"({model.config.hidden_size},), got "
                             f"{None if row is None else tuple(row.shape)}")
        model.attach_draft_mask_embedding()
        with torch.no_grad():
            model.draft_mask_embedding.copy_(row.to(dtype))


def save_draft_adapter(model: NLDModel, adapter_dir: str | Path) -> Path:
    """Write ``model``'s draft adapter (PEFT LoRA files + the draft MASK embedding, if any) to ``adapter_dir``."""
    adir = Path(adapter_dir)
    adir.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    lora = {k: v.detach().contiguous().cpu() for k, v in state.items() if "lora_" in k}
    if not lora:
        raise ValueError("the model has no draft adapter to save (attach_draft_adapter first)")
    some = next(m for m in model.modules() if getattr(m, "lora_A", None) is not None)
    rank = some.lora_A.weight.shape[0]
    targets = sorted({k.split(".")[-3] for k in lora})
    (adir / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": some.lora_scale * rank,
        "target_modules": targets, "bias": "none"}, indent=1))
    write_tensors({PEFT_PREFIX + k: v for k, v in lora.items()}, str(adir / "adapter_model.safetensors"))
    if model.draft_mask_embedding is not None:
        write_tensors({"draft_mask_embedding": model.draft_mask_embedding.detach().contiguous().cpu()},
                  str(adir / DRAFT_EMBEDDING_FILE))
    return adir


def save_checkpoint(model: NLDModel, path: str | Path, tokenizer_json: str | Path | None = None,
                    shards: int = 1) -> Path:
    """Write ``model`` in the NLD layout (base weights; the adapter, if any, under linear_spec_lora/)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.config.save(path / "config.json")
    base = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if not is_adapter_key(k)}
    if shards <= 1:
        write_tensors(base, str(path / "model.safetensors"), metadata={"format": "pt"})
    else:
        names = sorted(base)
        weight_map = {}
        for i in range(shards):
            part = names[i::shards]
            fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            write_tensors({n: base[n] for n in part}, str(path / fname), metadata={"format": "pt"})
            weight_map.update({n: fname for n in part})
        (path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    if model.has_draft_adapter:
        save_draft_adapter(model, path / ADAPTER_DIR)
    if tokenizer_json is not None:
        (path / "tokenizer.json").write_bytes(Path(tokenizer_json).read_bytes())
    return path
