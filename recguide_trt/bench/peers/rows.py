"""The table's rows: every backend x policy of ours, ``LLM()``'s default, and the peers.

A row is one (engine, options, per-call knobs) setting. Rows with the same interpreter, adapter
and constructor options share one worker process: our three policies on one backend are one
engine serving requests of three kinds, as in production.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

OUR_POLICIES: dict[str, dict] = {
    "ar": {"policy": "ar"},
    "linearspec L8": {"policy": "linearspec", "block_size": 8},
    "recguide": {"policy": "recguide"},
}
"""Label suffix -> SamplingParams knobs of our rows."""

PEERS: dict[str, tuple[str, str]] = {
    "ONNX Runtime GenAI": ("ort-genai", "ortg"),
    "OpenVINO GenAI": ("openvino-genai", "ov"),
    "vLLM CPU": ("vllm-cpu", "vllm"),
    "llama.cpp": ("llama.cpp", "lcpp"),
    "CTranslate2": ("ctranslate2", "ct2"),
    "transformers": ("transformers", "hf"),
}
"""Peer label -> (adapter, venv directory under the peers dir); the names setup_peers.sh uses."""

PROJECT_FALLBACK = {"transformers"}
"""Peers that may run in the project's own interpreter when their venv is absent (the project's
test extra installs transformers)."""


@dataclass(frozen=True)
class Row:
    """One line of the table."""

    label: str
    adapter: str
    opts: dict = field(default_factory=dict)
    """Adapter constructor options (part of the worker key)."""
    knobs: dict = field(default_factory=dict)
    """Per-call options (our policy and block size)."""
    venv: str | None = None
    """Venv directory name under the peers dir; None: the interpreter running the benchmark."""
    ours: bool = False

    def python(self, peers_dir: Path) -> str:
        """The interpreter this row's worker runs with."""
        if self.venv is None:
            return sys.executable
        venv_py = peers_dir / self.venv / "bin" / "python"
        if not venv_py.exists() and self.adapter in PROJECT_FALLBACK:
            return sys.executable
        return str(venv_py)

    def worker_key(self, peers_dir: Path) -> str:
        return f"{self.python(peers_dir)}|{self.adapter}|{json.dumps(self.opts, sort_keys=True)}"


def our_rows(backends: tuple[str, ...] | list[str], default: bool = True) -> list[Row]:
    """Every backend x policy, then (``default``) the same policies on ``LLM()``'s default backend."""
    rows = [Row(f"ours {b} {p}", "ours", {"backend": b}, k, ours=True)
            for b in backends for p, k in OUR_POLICIES.items()]
    if default:
        rows += [Row(f"ours default {p}", "ours", {"backend": None}, k, ours=True) for p, k in OUR_POLICIES.items()]
    return rows


def peer_rows(names: list[str] | None = None) -> list[Row]:
    """The peers (all, or those named), in :data:`PEERS` order."""
    unknown = set(names or ()) - set(PEERS)
    if unknown:
        raise ValueError(f"unknown peer(s) {sorted(unknown)}; known: {', '.join(PEERS)}")
    return [Row(label, adapter, venv=venv) for label, (adapter, venv) in PEERS.items()
            if names is None or label in names]


def reference_label(rows: list[Row]) -> str | None:
    """The greedy reference: our AR on the torch backend (or the first AR row of ours)."""
    labels = [r.label for r in rows if r.ours and r.knobs.get("policy") == "ar"]
    return "ours torch ar" if "ours torch ar" in labels else (labels[0] if labels else None)
