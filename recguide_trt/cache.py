"""The one on-disk cache of the package: step-cost tables and on-the-fly ONNX exports.

``RECGUIDE_CACHE`` (default ``~/.cache/recguide_trt``) is its root: cost tables are
``cost_<key>.json`` in it, ONNX exports live under ``onnx/``. ``RECGUIDE_CACHE_DIR`` (the old name
of the export cache) is still read when ``RECGUIDE_CACHE`` is unset, with a warning.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

CACHE_ENV = "RECGUIDE_CACHE"
OLD_ENV = "RECGUIDE_CACHE_DIR"
log = logging.getLogger(__name__)
_warned = False


def cache_root() -> Path:
    """The cache directory (not created)."""
    global _warned
    value = os.environ.get(CACHE_ENV)
    if not value and os.environ.get(OLD_ENV):
        if not _warned:
            log.warning("%s is deprecated: set %s (one cache for cost tables and exports)", OLD_ENV, CACHE_ENV)
            _warned = True
        value = os.environ[OLD_ENV]
    return Path(value) if value else Path.home() / ".cache" / "recguide_trt"


def _umask() -> int:
    """The process umask, read without changing it (``os.umask`` sets it, a race with other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def permissions_as_umask(path: str | Path) -> None:
    """Give ``path`` the mode ``open`` / ``mkdir`` would have given it under the umask (0644 / 0755 usually).

    safetensors' ``save_file`` writes 0600 files and ``tempfile.mkdtemp`` makes 0700 directories: a model imported
    into a cache, or an adapter trained into a directory, would then be unreadable by the other users of a shared
    cache (a server running under its own account, a container's non-root user)."""
    p = Path(path)
    p.chmod((0o777 if p.is_dir() else 0o666) & ~_umask())
