"""Tuning trtllm-schedule's draft_len_schedule: the best fixed block per C, a file the bench reads,
calibration prompts that are never the benchmark's."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from recguide_trt.bench.schedule_calibration import read_schedule, schedule_from_summary, write_schedule
from recguide_trt.bench.sweep import add_bench_args, run_bench

REPO = Path(__file__).resolve().parents[2]


def test_the_schedule_is_the_best_fixed_draft_length_per_c():
    summary = [{"C": 1, "best_fixed": "linearspec-L16"}, {"C": 4, "best_fixed": "linearspec-L8"},
               {"C": 16, "best_fixed": "ar"}, {"C": 64, "best_fixed": "linearspec-L2"}, {"C": 128, "best_fixed": None}]
    blocks = {"ar": None, "linearspec-L2": 2, "linearspec-L8": 8, "linearspec-L16": 16}
    assert schedule_from_summary(summary, blocks) == {1: 15, 4: 7, 16: 0, 64: 1}
    with pytest.raises(ValueError, match="no known block"):
        schedule_from_summary([{"C": 1, "best_fixed": "recguide"}], blocks)
    with pytest.raises(ValueError, match="no fixed policy"):
        schedule_from_summary([{"C": 1, "best_fixed": None}], blocks)


def test_schedule_files_round_trip_and_bad_ones_name_the_file(tmp_path):
    path = tmp_path / "s.json"
    write_schedule(path, {4: 3, 1: 7}, {"cpu": "x"})
    assert read_schedule(path) == {1: 7, 4: 3} and list(read_schedule(path)) == [1, 4]
    for text, match in (("{", "not a readable JSON"), ('{"draft_len_schedule": {}}', "non-empty"),
                        ('{"draft_len_schedule": {"a": 1}}', "must be integers"),
                        ('{"draft_len_schedule": {"0": 1}}', "batch sizes >= 1")):
        path.write_text(text)
        with pytest.raises(ValueError, match=match) as err:
            read_schedule(path)
        assert str(path) in str(err.value)
    with pytest.raises(ValueError, match="calibrate_draft_len_schedule"):
        read_schedule(tmp_path / "missing.json")


def _script(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "calibrate_draft_len_schedule.py"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_calibration_script_writes_a_schedule_the_bench_runs(ckpt, tmp_path):
    """The README's calibration command, then the bench's peer controllers reading its file."""
    sched = tmp_path / "schedule.json"
    common = ["--model", str(ckpt), "--backend", "torch", "--concurrency", "1,2", "--blocks", "2",
              "--requests", "2", "--max-tokens", "8", "--ignore-eos", "--num-prompts", "8", "--no-progress",
              "--no-plots"]
    res = _script(*common, "--workload", "random", "--out", str(tmp_path / "cal"), "--schedule-out", str(sched),
                  "--repeats", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(sched.read_text())
    assert set(data["draft_len_schedule"]) == {"1", "2"}
    assert set(data["draft_len_schedule"].values()) <= {0, 1, 3}   # AR, L2 or the model's default L4
    assert data["provenance"]["workload"] == "random" and data["provenance"]["best_fixed"]

    out = tmp_path / "bench"
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_concurrency.py"), *common, "--workload",
                          "random", "--policies", "ar,recguide,peers", "--draft-len-schedule", str(sched),
                          "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "/ best peer (" in res.stdout
    res = json.loads((out / "results.json").read_text())
    peers = ["trtllm-schedule", "sglang-adaptive", "sglang-autospec", "vllm-adaptive-k"]
    assert res["policies"] == ["ar", "recguide", *peers]
    table = (out / "table.md").read_text()
    assert "RecGuide / best peer" in table and all(f"RecGuide / {p}" in table for p in peers)
    for row in res["summary"]:
        assert row["best_fixed"] == "ar" and row["best_peer"] in peers
        assert set(row["recguide_over_peer"]) == set(peers)
    trt = res["engine_stats_total"]["trtllm-schedule"]
    assert {int(k): v for k, v in trt["schedule"].items()} == read_schedule(sched)


def test_calibration_refuses_the_benchmarks_prompts(tmp_path):
    res = _script("--workload", "mixed", "--out", str(tmp_path), timeout=120)
    assert res.returncode == 2 and "holds the benchmark's prompts" in res.stderr
    res = _script("--workload", "random", "--policies", "ar,recguide", "--out", str(tmp_path), timeout=120)
    assert res.returncode == 2 and "fixed policies" in res.stderr


def test_bench_without_a_schedule_file_says_how_to_make_one(ckpt, tmp_path):
    args = add_bench_args(argparse.ArgumentParser()).parse_args(
        ["--model", str(ckpt), "--policies", "trtllm-schedule", "--draft-len-schedule", str(tmp_path / "no.json")])
    with pytest.raises(SystemExit, match="calibrate_draft_len_schedule"):
        run_bench(args)
