"""Named ranges (schedule, draft, verify, fused, accept, …) for nsys and for Chrome/Perfetto traces.

With the ``nvtx`` package installed the ranges go to NVTX domain "RecGuide" (free unless a profiler
listens). ``record_trace()`` additionally collects them in-process, so ``recguide profile`` can write
a Chrome trace on machines without nsys.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path

try:  # optional dependency
    import nvtx as _nvtx

    _DOMAIN = _nvtx.get_domain("RecGuide")
except Exception:  # pragma: no cover - depends on the environment
    _nvtx = None
    _DOMAIN = None

_events: list[dict] | None = None
_t0 = 0.0


@contextlib.contextmanager
def trace_range(name: str):
    rng = None
    if _DOMAIN is not None:
        rng = _DOMAIN.start_range(message=name)
    start = time.perf_counter()
    try:
        yield
    finally:
        if rng is not None:
            _DOMAIN.end_range(rng)
        if _events is not None:
            _events.append({"name": name, "ph": "X", "ts": (start - _t0) * 1e6,
                            "dur": (time.perf_counter() - start) * 1e6, "pid": os.getpid(),
                            "tid": threading.get_ident() % 100000, "cat": "RecGuide"})


@contextlib.contextmanager
def record_trace(path: str | Path):
    """Collect every range inside the block and write a Chrome trace (open in ui.perfetto.dev)."""
    global _events, _t0
    _events, _t0 = [], time.perf_counter()
    try:
        yield
    finally:
        events, _events = _events, None
        Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
