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
    assert "per repeat: median (min–max)" in table and "| 1.050 (1.000–1.100) |" in table


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
    assert "| 1 | 1.095 | 1.045 | 1.045 | vllm-adaptive-k | 1.050 (1.000–1.100) |" in table


def _forwards(cell: dict, **f: int) -> dict:
    cell["metrics"]["forwards"] = {"prefill": 8, **f}
    return cell


def test_ratios_of_identical_ar_work_are_flagged_as_drift():
    cells = [_forwards(_cell("ar", 32, [220.0, 210.0]), ar=6000),
             _forwards(_cell("linearspec-L8", 32, [80.0, 85.0]), draft=1800, verify=1800),
             _forwards(_cell("recguide", 32, [200.0, 215.0]), draft=1, verify=1, ar=5998),
             _forwards(_cell("vllm-adaptive-k", 32, [225.0, 205.0]), ar=6000),
             _forwards(_cell("ar", 1, [50.0, 50.0]), ar=900),
             _forwards(_cell("linearspec-L8", 1, [70.0, 70.0]), draft=200, verify=200),
             _forwards(_cell("recguide", 1, [72.0, 72.0]), fused=150, draft=60, verify=60),
             _forwards(_cell("vllm-adaptive-k", 1, [60.0, 60.0]), draft=300, verify=300)]
    labels = ["ar", "linearspec-L8", "recguide", "vllm-adaptive-k"]
    rows = summarize(cells, labels, "linearspec-L8", ["ar", "linearspec-L8"], "recguide", ["vllm-adaptive-k"])
    c1, c32 = rows
    assert c32["recguide_same_work_as_best_fixed"] and c32["recguide_same_work_as_best_peer"]
    assert not c1["recguide_same_work_as_best_fixed"] and not c1["recguide_same_work_as_best_peer"]
    table = markdown_table(rows, cells, labels, "linearspec-L8", "recguide", "t")
    assert "Same work: C = 32, RecGuide and the best fixed and the best peer ran AR steps only" in table
    assert "C = 1," not in table


def test_a_policy_that_drafts_more_than_a_stray_round_is_not_ar_only():
    from recguide_trt.bench.report import ar_only

    assert ar_only(_forwards(_cell("x", 1, None), ar=990, draft=5, verify=5))
    assert not ar_only(_forwards(_cell("x", 1, None), ar=980, draft=10, verify=10))
    assert not ar_only(_forwards(_cell("x", 1, None)))   # prefill only: no decode to judge
    assert not ar_only(None)
