"""The peers' own speculation settings, tuned on training prompts (issue #25 item 5).

Each peer's n-gram speculation has two knobs: ``prompt_lookup`` (draft tokens per step) and ``ngram``
(the longest n-gram matched). :func:`tune` times every grid point on prompts of the *training* split
(the benchmark's held-out prompts are never used), one engine process per point, and keeps the fastest
at batch 1. The winners live in ``spec_tuned.json`` beside this file, per model; :func:`spec_options`
gives a peer's tuned options for a model, or its sample values (``rows.PEER_SPEC``) where none were tuned.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TUNED = Path(__file__).with_name("spec_tuned.json")
"""``{model: {peer label: {"prompt_lookup": K, "ngram": N}}, "_runs": {model: {peer label: how it was measured}}}``."""


@dataclass(frozen=True)
class Point:
    """One grid point of one peer and what it measured."""

    label: str
    prompt_lookup: int
    ngram: int
    tok_s: float | None
    """Batch-1 tokens per second (best round), None if the point failed."""
    error: str = ""

    @property
    def opts(self) -> dict:
        return {"prompt_lookup": self.prompt_lookup, "ngram": self.ngram}


def parse_grid(text: str, name: str) -> list[int]:
    """``"3,5,8"`` -> [3, 5, 8]; a ValueError naming the option otherwise."""
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise ValueError(f"{name}: expected comma-separated positive integers, got {text!r}") from None
    if not values or values[0] < 1:
        raise ValueError(f"{name}: expected comma-separated positive integers, got {text!r}")
    return values


def tune(labels: list[str], lookups: list[int], ngrams: list[int],
         measure: Callable[[str, dict], float], log: Callable[[str], None] = print) -> dict[str, list[Point]]:
    """Every (prompt_lookup, ngram) of each peer label, timed by ``measure(label, opts)`` (batch-1 tok/s;
    it raises to report a failed point). Points whose ``ngram`` exceeds ``prompt_lookup`` are kept: the
    knobs are independent in every engine."""
    out: dict[str, list[Point]] = {}
    for label in labels:
        points = []
        for k in lookups:
            for n in ngrams:
                try:
                    rate = measure(label, {"prompt_lookup": k, "ngram": n})
                    points.append(Point(label, k, n, rate))
                    log(f"{label:32s} prompt_lookup={k:<3d} ngram={n:<3d} {rate:8.1f} tok/s")
                except Exception as exc:  # one failed point (an engine refusing a value) is reported, not fatal
                    points.append(Point(label, k, n, None, str(exc).splitlines()[0][:200]))
                    log(f"{label:32s} prompt_lookup={k:<3d} ngram={n:<3d} FAILED: {points[-1].error}")
        out[label] = points
    return out


def best(points: list[Point]) -> Point | None:
    """The fastest point that ran (the first on ties), or None."""
    ran = [p for p in points if p.tok_s is not None]
    return max(ran, key=lambda p: p.tok_s) if ran else None


def load_tuned(path: Path = TUNED) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def spec_options(label: str, model: str, sample: dict, path: Path = TUNED) -> dict:
    """``label``'s tuned options for ``model``, or ``sample`` (its engine's sample values) if none were tuned."""
    tuned = load_tuned(path).get(model, {}).get(label)
    return dict(tuned) if tuned else dict(sample)


def save_tuned(model: str, winners: dict[str, dict], run: dict, path: Path = TUNED) -> None:
    """Record ``winners`` (label -> options) for ``model``, and how they were measured."""
    data = load_tuned(path)
    data.setdefault(model, {}).update(winners)
    runs = data.setdefault("_runs", {}).setdefault(model, {})
    runs.update({label: run for label in winners})
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
