"""What every engine adapter provides, and the helpers they share.

An adapter loads the converted model once (in its constructor) and then answers two calls, both
greedy, fp32, EOS ignored (every prompt gets exactly ``max_tokens`` new tokens):

- ``serial(prompts, max_tokens, **knobs)``: the prompts one at a time (batch-1 latency path)
- ``batch(prompts, max_tokens, **knobs)``: all prompts submitted at once (the engine batches)

``prompts`` are lists of token ids; both return the new token ids of each prompt, in order.
Only the standard library is imported here: this module runs in every engine's venv.
"""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path
from typing import Protocol

EOS_ID = 2
"""The embedded model's EOS token (``config.json``); :func:`special_ids` has the benchmarked model's."""
MASK_ID = 3
"""``<mask>``: never emitted by the AR head, so engines without an ignore-EOS switch use it as EOS."""
PAD_ID = 0
GGUF_NAMES = ("model-f32.gguf", "nld-tiny-f32.gguf")
"""llama.cpp's file in :func:`models_dir`: ``setup_peers.sh --model NAME`` writes the first, the embedded
model's (in the peers dir itself) is the second."""


class Adapter(Protocol):
    """The two calls the worker makes."""

    def serial(self, prompts: list[list[int]], max_tokens: int, **knobs) -> list[list[int]]: ...

    def batch(self, prompts: list[list[int]], max_tokens: int, **knobs) -> list[list[int]]: ...


def threads() -> int:
    """Threads per engine: the worker's ``OMP_NUM_THREADS`` (the client sets it; default 2)."""
    return int(os.environ.get("OMP_NUM_THREADS", "2"))


def peers_dir() -> Path:
    """Where ``scripts/setup_peers.sh`` put the venvs and converted models (the client passes it on)."""
    return Path(os.environ.get("RECGUIDE_PEERS_DIR", "/tmp/recguide-peers"))


def models_dir() -> Path:
    """Where the benchmarked model's conversions are (``hf-llama``, ``ov-llama``, ...): the peers dir for the
    embedded model, ``<peers dir>/<model>`` for another (the client sets ``RECGUIDE_PEERS_MODELS``)."""
    return Path(os.environ.get("RECGUIDE_PEERS_MODELS") or peers_dir())


def special_ids() -> dict[str, int]:
    """``eos``, ``mask`` and ``pad`` of the converted model (its ``hf-llama/config.json``; the embedded
    model's where a key is missing)."""
    path = models_dir() / "hf-llama" / "config.json"
    cfg = json.loads(path.read_text()) if path.is_file() else {}
    return {"eos": cfg.get("eos_token_id", EOS_ID), "mask": cfg.get("mask_token_id", MASK_ID),
            "pad": cfg.get("pad_token_id", PAD_ID)}


def versions(*dists: str) -> dict[str, str]:
    """Installed versions of the named distributions (those not installed are left out)."""
    out = {}
    for d in dists:
        try:
            out[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            pass
    return out


def left_pad(prompts: list[list[int]], pad: int = PAD_ID) -> tuple[list[list[int]], list[list[int]], int]:
    """(ids, attention mask, width): prompts left-padded to the longest, for static-batch engines."""
    width = max(len(p) for p in prompts)
    ids = [[pad] * (width - len(p)) + list(p) for p in prompts]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    return ids, mask, width


def one_at_a_time(batch_fn, prompts: list[list[int]], max_tokens: int, **knobs) -> list[list[int]]:
    """``serial`` for engines whose batch call also serves one prompt: call it per prompt."""
    return [batch_fn([p], max_tokens, **knobs)[0] for p in prompts]
