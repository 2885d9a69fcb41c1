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
