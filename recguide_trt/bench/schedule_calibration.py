"""Tuning TensorRT-LLM's ``draft_len_schedule`` for this engine, the way a user of it would.

The schedule is a table batch size -> draft length that someone has to fill in. Its users tune it
offline: run each fixed draft length at each batch size and keep the fastest. That is what this
does — a calibration sweep of AR and every fixed block (the bench's own sweep) on prompts the
benchmark never judges (the training split, ``--workload stdlib-train``; the simulator uses
documents outside the benchmark's), then per batch size the best fixed block's draft length
(block L -> L - 1; AR -> 0). The file it writes is what ``recguide bench`` and
``scripts/simulate.py`` read for the ``trtllm-schedule`` controller.
"""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_SCHEDULE = Path("docs/bench/draft_len_schedule.json")
"""Where the measured bench looks for the tuned schedule (written by
``scripts/calibrate_draft_len_schedule.py``)."""


def schedule_from_summary(summary: list[dict], blocks: dict[str, int | None]) -> dict[int, int]:
    """{C: draft length of the fastest fixed policy at C} from a sweep summary.

    ``blocks``: each fixed policy label's block (None or 1 for AR).
    """
    schedule = {}
    for row in summary:
        best = row.get("best_fixed")
        if best is None:
            continue
        if best not in blocks:
            raise ValueError(f"best fixed policy {best!r} has no known block")
        schedule[int(row["C"])] = max(0, (blocks[best] or 1) - 1)
    if not schedule:
        raise ValueError("the calibration sweep measured no fixed policy")
    return dict(sorted(schedule.items()))


def write_schedule(path: Path, schedule: dict[int, int], provenance: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"draft_len_schedule": {str(k): v for k, v in sorted(schedule.items())}, "provenance": provenance}
    path.write_text(json.dumps(payload, indent=1) + "\n")


def read_schedule(path: Path) -> dict[int, int]:
    """The schedule of a file from :func:`write_schedule` (ValueError naming the file otherwise)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no draft_len_schedule file; write one with "
                         f"scripts/calibrate_draft_len_schedule.py") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON file ({exc})") from None
    raw = data.get("draft_len_schedule") if isinstance(data, dict) else None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: expected an object with a non-empty 'draft_len_schedule' map")
    try:
        schedule = {int(k): int(v) for k, v in raw.items()}
    except (TypeError, ValueError):
        raise ValueError(f"{path}: draft_len_schedule keys and values must be integers, got {raw}") from None
    if any(k < 1 for k in schedule) or any(v < 0 for v in schedule.values()):
        raise ValueError(f"{path}: draft_len_schedule needs batch sizes >= 1 and draft lengths >= 0, got {raw}")
    return dict(sorted(schedule.items()))


BENCHMARK_WORKLOADS = ("humaneval", "stdlib", "mixed")
"""Workloads whose prompts the benchmark judges: tuning on them would be tuning on the test set."""

