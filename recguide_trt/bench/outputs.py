"""Where a benchmark script's results go: its Markdown table and its raw results, side by side."""

from __future__ import annotations

import json
from pathlib import Path


def write_table_and_results(out: Path | None, md: str, results: dict) -> None:
    """``OUT/table.md`` and ``OUT/results.json`` (nothing when ``out`` is None), and a line saying where."""
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(md)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"-> {out / 'table.md'}, {out / 'results.json'}")
