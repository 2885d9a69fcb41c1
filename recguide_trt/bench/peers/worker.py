"""A long-lived engine worker: loads one adapter, then answers generate requests (JSON lines).

Run by :mod:`.client` with that engine's venv interpreter, as a file (the peer venvs do not
have this package installed)::

    VENV/bin/python recguide_trt/bench/peers/worker.py ADAPTER '{"opt": ...}'

Protocol, one JSON object per line:

- first reply: ``{"ready": true, "load_s": s, "info": {...}, "python": path}`` once the model is
  loaded, or ``{"ready": false, "error": ..., "trace": ...}``
- request ``{"op": "generate", "mode": "serial" | "batch", "prompts": [[ids]], "max_tokens": n,
  "knobs": {...}}`` -> ``{"outputs": [[ids]], "elapsed_s": s, "tokens": n}``; ``elapsed_s`` is
  timed here, around the adapter call only. An output that is not exactly ``max_tokens`` long is an
  error (the benchmark's contract is EOS ignored).
- request ``{"op": "quit"}`` -> exits.

Replies go to the original stdout; anything the engine prints is sent to stderr so it cannot
corrupt the protocol.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

ALIAS = "recguide_peers"
"""The name this directory is imported under when the worker runs as a file in a peer's venv."""


def _error(exc: BaseException) -> dict[str, str]:
    return {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}


def handle(adapter: Any, req: dict) -> dict:
    """Run one generate request on ``adapter``; the reply dict (never raises)."""
    try:
        fn = {"serial": adapter.serial, "batch": adapter.batch}[req["mode"]]
        prompts, n = req["prompts"], int(req["max_tokens"])
        t0 = time.perf_counter()
        outs = fn(prompts, n, **req.get("knobs", {}))
        elapsed = time.perf_counter() - t0
        outs = [[int(t) for t in o] for o in outs]
        bad = [i for i, o in enumerate(outs) if len(o) != n]
        if len(outs) != len(prompts) or bad:
            raise RuntimeError(f"{len(outs)} outputs for {len(prompts)} prompts; outputs "
                               f"{bad[:8]} are not {n} tokens long (EOS must be ignored)")
        return {"outputs": outs, "elapsed_s": elapsed, "tokens": sum(map(len, outs))}
    except Exception as exc:  # the client reports it against this row and goes on
        return _error(exc)


def serve(adapter: Any, lines: Iterable[str], out: IO[str]) -> None:
    """Answer requests from ``lines`` on ``out`` until ``quit`` or end of input."""
    for line in lines:
        if not line.strip():
            continue
        req = json.loads(line)
        if req.get("op") == "quit":
            return
        out.write(json.dumps(handle(adapter, req)) + "\n")
        out.flush()


def start(adapters: Any, name: str, opts: dict, out: IO[str]) -> Any | None:
    """Construct adapter ``name`` and write the ready line; None (after an error line) on failure."""
    t0 = time.perf_counter()
    try:
        adapter = adapters.load(name)(**opts)
    except Exception as exc:
        out.write(json.dumps({"ready": False, **_error(exc)}) + "\n")
        out.flush()
        return None
    out.write(json.dumps({"ready": True, "load_s": time.perf_counter() - t0, "python": sys.executable,
                          "info": getattr(adapter, "info", {})}) + "\n")
    out.flush()
    return adapter


def _adapters_module() -> Any:
    """The adapters package: imported normally, or with this directory registered as :data:`ALIAS`."""
    if __package__:
        return importlib.import_module(f"{__package__}.adapters")
    here = Path(__file__).resolve().parent
    # Run as a file, this directory is sys.path[0]: its module names (client, run, report, ...)
    # would shadow top-level modules of the engine's own dependencies.
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    spec = importlib.util.spec_from_file_location(ALIAS, here / "__init__.py", submodule_search_locations=[str(here)])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[ALIAS] = pkg
    spec.loader.exec_module(pkg)
    return importlib.import_module(f"{ALIAS}.adapters")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # C-level prints of the engine go to stderr too
    sys.stdout = sys.stderr
    adapter = start(_adapters_module(), argv[0], json.loads(argv[1]) if len(argv) > 1 else {}, proto)
    if adapter is None:
        return 1
    serve(adapter, sys.stdin, proto)
    return 0


if __name__ == "__main__":
    sys.exit(main())
