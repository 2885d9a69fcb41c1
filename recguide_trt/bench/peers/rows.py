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
from typing import NamedTuple

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

PEER_SPEC: dict[str, tuple[str, str, dict]] = {
    "ONNX Runtime GenAI n-gram": ("ort-genai", "ortg", {"prompt_lookup": 5, "ngram": 3}),
    "OpenVINO GenAI prompt lookup": ("openvino-genai", "ov", {"prompt_lookup": 5, "ngram": 3}),
    "vLLM CPU ngram": ("vllm-cpu", "vllm", {"prompt_lookup": 5, "ngram": 4}),
    "llama.cpp prompt lookup": ("llama.cpp", "lcpp", {"prompt_lookup": 10, "ngram": 2}),
}
"""Each peer's own draft-free speculation (drafts copied from the context by n-gram match), label ->
(adapter, venv, adapter options): ``prompt_lookup`` draft tokens per step, ``ngram`` the longest
n-gram matched; the values of each engine's own sample or defaults (OpenVINO GenAI's prompt-lookup
sample, vLLM's n-gram docs, llama-cpp-python's ``LlamaPromptLookupDecoding``), used where no setting was
tuned for the model (``spec_tuned.json``, :mod:`.spec_tuning`). Not in the default run: ``--spec-peers``
adds those of the selected peers, ``--peers`` takes their labels too."""

PRECISIONS = ("float32", "default")
"""``float32``: every engine forced to float32 arithmetic (and KV); ``default``: each peer as it runs by
default (vLLM, OpenVINO GenAI, transformers and CTranslate2 then compute in the checkpoint's bf16 where the
CPU has it), and our rows also with bf16 compute + KV (:data:`OUR_BF16`). ONNX Runtime GenAI's export is
float32 either way: its model builder takes the precision at export time (``setup_peers.sh``)."""

DEFAULT_PRECISION_ADAPTERS = {"vllm-cpu", "openvino-genai", "transformers", "ctranslate2"}
"""The adapters that take ``precision="default"``."""

OUR_BF16 = {"compute_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"}
"""Our rows' options in bf16 (label suffix ``bf16``): our counterpart of a peer's default bf16 compute."""

OUR_KV16 = {"kv_cache_dtype": "bfloat16"}
"""Our rows' options with float32 arithmetic over a bf16 KV cache (label suffix ``kv16``): our counterpart of a
peer that keeps float32 arithmetic but a smaller KV cache by default (OpenVINO GenAI's CPU plugin: a u8 cache),
and our best setting at high load where the CPU has no bf16 dot (bf16 compute is emulated there)."""

class OurVariant(NamedTuple):
    """Our rows under one label suffix."""

    options: dict
    """The options its rows add to ours."""
    what: str
    """What the summary calls them: "our best with ..."."""


OUR_SUFFIXES = {" bf16": OurVariant(OUR_BF16, "bf16 compute"), " kv16": OurVariant(OUR_KV16, "a bf16 KV cache")}
"""Our rows' label suffixes: the options each adds, and its name in the summary (:mod:`.report`)."""

EMBEDDED = "tiny"
"""The model the benchmark was written for; its conversions lie in the peers dir itself."""

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


def model_files(peers_dir: Path, model: str = EMBEDDED) -> Path:
    """Where ``setup_peers.sh --model MODEL`` puts the model's conversions (``hf-llama``, ``ov-llama``, ...):
    the peers dir for the embedded model, ``<peers dir>/<name>`` for a named model or a checkpoint directory."""
    return Path(peers_dir) if model == EMBEDDED else Path(peers_dir) / Path(model).name


def worker_log_dir(files: Path) -> Path:
    """Where the peers' worker logs go: ``logs`` beside the model's conversions (``model_files``), or a
    temporary directory when those are missing (the workers will then say why they cannot load)."""
    import tempfile

    return files / "logs" if files.is_dir() else Path(tempfile.gettempdir()) / "recguide-peers-logs"


def our_rows(backends: tuple[str, ...] | list[str], default: bool = True, model: str = EMBEDDED,
             bf16: bool = False, kv16: bool = False) -> list[Row]:
    """Every backend x policy, then (``default``) the same policies on ``LLM()``'s default backend; with
    ``bf16`` every backend x policy again with bf16 compute + KV (:data:`OUR_BF16`), with ``kv16`` again with
    float32 arithmetic over a bf16 KV cache (:data:`OUR_KV16`)."""
    wanted = {" bf16": bf16, " kv16": kv16}
    variants = [("", {})] + [(sfx, v.options) for sfx, v in OUR_SUFFIXES.items() if wanted[sfx]]
    rows = [Row(f"ours {b} {p}{sfx}", "ours", {"backend": b, "model": model, **opts}, k, ours=True)
            for sfx, opts in variants for b in backends for p, k in OUR_POLICIES.items()]
    if default:
        rows += [Row(f"ours default {p}", "ours", {"backend": None, "model": model}, k, ours=True)
                 for p, k in OUR_POLICIES.items()]
    return rows


def peer_rows(names: list[str] | None = None, spec: bool = False, precision: str = "float32",
              model: str = EMBEDDED) -> list[Row]:
    """The peers (all of :data:`PEERS`, or those named, from it or :data:`PEER_SPEC`), in that order; with
    ``spec`` each selected peer's speculation row after them, with its settings tuned for ``model`` where
    ``scripts/tune_peer_spec.py`` recorded some (:func:`.spec_tuning.spec_options`), else its sample values.
    ``precision`` (:data:`PRECISIONS`): ``default`` runs the peers that have a default other than float32
    that way, labelled ``(default)``."""
    from .spec_tuning import spec_options

    unknown = set(names or ()) - set(PEERS) - set(PEER_SPEC)
    if unknown:
        raise ValueError(f"unknown peer(s) {sorted(unknown)}; known: {', '.join([*PEERS, *PEER_SPEC])}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")

    def row(label: str, adapter: str, venv: str, opts: dict) -> Row:
        if precision == "default" and adapter in DEFAULT_PRECISION_ADAPTERS:
            return Row(f"{label} (default)", adapter, {**opts, "precision": "default"}, venv=venv)
        return Row(label, adapter, opts, venv=venv)

    rows = [row(label, adapter, venv, {}) for label, (adapter, venv) in PEERS.items()
            if names is None or label in names]
    venvs = {r.venv for r in rows}
    return rows + [row(label, adapter, venv, spec_options(label, model, opts))
                   for label, (adapter, venv, opts) in PEER_SPEC.items()
                   if (names is not None and label in names) or (spec and venv in venvs)]


def reference_label(rows: list[Row]) -> str | None:
    """The greedy reference: our AR on the torch backend (or the first AR row of ours)."""
    labels = [r.label for r in rows if r.ours and r.knobs.get("policy") == "ar"]
    return "ours torch ar" if "ours torch ar" in labels else (labels[0] if labels else None)
