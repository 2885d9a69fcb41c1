"""The sweep's summary and Markdown table: oracle choice, ratios, per-repeat spread."""

from __future__ import annotations

import pytest

from recguide_trt.bench.report import markdown_table, summarize


def _cell(policy: str, C: int, repeats: list[float] | None) -> dict:
    tp = {"output_tok_s": sum(repeats) / len(repeats)} if repeats else {"output_tok_s": 100.0}
    if repeats:
        tp["repeats"] = repeats
    return {"policy": policy, "C": C, "throughput": tp, "metrics": {"per_request_tok_s": 1.0}, "engine": {}}


def test_ratio_per_repeat_pairs_the_same_rotation_round():
    cells = [_cell("ar", 1, [100.0, 120.0]), _cell("linearspec-L8", 1, [150.0, 130.0]),
             _cell("recguide", 1, [150.0, 143.0])]
    labels = ["ar", "linearspec-L8", "recguide"]
    [row] = summarize(cells, labels, "linearspec-L8", ["ar", "linearspec-L8"], "recguide")
    assert row["best_fixed"] == "linearspec-L8"
    assert row["recguide_over_best_fixed"] == pytest.approx(146.5 / 140.0)
    assert row["recguide_over_best_fixed_repeats"] == pytest.approx([1.0, 1.1])
    table = markdown_table([row], cells, labels, "linearspec-L8", "recguide", "t")
    assert "per repeat (min–max)" in table and "| 1.000–1.100 |" in table


def test_no_spread_column_without_repeats():
    cells = [_cell("ar", 1, None), _cell("recguide", 1, None)]
    rows = summarize(cells, ["ar", "recguide"], None, ["ar"], "recguide")
    assert rows[0]["recguide_over_best_fixed_repeats"] is None
    assert "per repeat" not in markdown_table(rows, cells, ["ar", "recguide"], None, "recguide", "t")


def test_peer_controllers_get_their_own_ratios():
    cells = [_cell("ar", 1, [100.0, 100.0]), _cell("recguide", 1, [120.0, 110.0]),
             _cell("trtllm-schedule", 1, [100.0, 110.0]), _cell("vllm-adaptive-k", 1, [120.0, 100.0])]
    labels = ["ar", "recguide", "trtllm-schedule", "vllm-adaptive-k"]
    [row] = summarize(cells, labels, None, ["ar"], "recguide", ["trtllm-schedule", "vllm-adaptive-k"])
    assert row["best_fixed"] == "ar"   # peers are not part of the fixed oracle
    assert row["best_peer"] == "vllm-adaptive-k" or row["best_peer"] == "trtllm-schedule"
    assert row["recguide_over_peer"] == pytest.approx({"trtllm-schedule": 115 / 105, "vllm-adaptive-k": 115 / 110})
    assert row["best_peer"] == "vllm-adaptive-k" and row["recguide_over_best_peer"] == pytest.approx(115 / 110)
    assert row["recguide_over_best_peer_repeats"] == pytest.approx([1.0, 1.1])
    table = markdown_table([row], cells, labels, None, "recguide", "t")
    assert "RecGuide / trtllm-schedule" in table and "RecGuide / best peer" in table
    assert "| 1 | 1.095 | 1.045 | 1.045 | vllm-adaptive-k | 1.000–1.100 |" in table
