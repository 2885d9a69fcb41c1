"""The model cache (``<RECGUIDE_CACHE>/models``) and atomic writes into it.

An import writes into a hidden sibling directory and renames it into place only when complete, so
an interrupted import leaves nothing that looks like a model; a lock file serialises concurrent first
uses of one name (the second caller waits, then finds the finished directory).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..cache import cache_root, permissions_as_umask


def models_dir() -> Path:
    """Where named models are imported to (not created)."""
    return cache_root() / "models"


def downloads_dir() -> Path:
    """Where fetched source files (wheels, hub snapshots) are kept, so a re-import needs no network."""
    return cache_root() / "downloads"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """An exclusive inter-process lock named ``name`` under the cache (held for the ``with`` body)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def atomic_dir(out: Path, overwrite: bool = False) -> Iterator[Path]:
    """A scratch directory that becomes ``out`` when the ``with`` body succeeds (and vanishes otherwise)."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists: choose another --out or remove it first")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield tmp
        permissions_as_umask(tmp)  # mkdtemp's 0700: the cache may be shared
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
