"""scripts/bench_forward.py as a user runs it (a subprocess), on the embedded stand-in."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.scripts.runner import run_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench_forward.py"
SOURCE = REPO / "recguide_trt" / "backends" / "native" / "nld_cpu.cpp"


def run(*args: str) -> subprocess.CompletedProcess:
    return run_script("bench_forward.py", *args)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("extra, columns", [
    (["--bf16"], ["before ms", "speed-up", "paired", "bf16 ms", "bf16+kv ms"]),
    (["--ab-dtype", "bfloat16"], ["before ms", "paired"]),
])
def test_table_with_a_before_kernel(tmp_path, extra, columns):
    # --before with the current source: the same build (cached by source), so only the columns are new
    r = run("--model", "tiny", "--shapes", "1x1,1x4,2x1", "--past", "8", "--past-64", "8", "--reps", "1",
            "--before", str(SOURCE), *extra, "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    table = (tmp_path / "table.md").read_text()
    for col in columns:
        assert f"| {col} |" in table
    arith = "bf16 compute + bf16 KV" if "--ab-dtype" in extra else "float32"
    assert f"'ms' and 'before' columns: {arith} arithmetic." in table
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [tuple(r["shape"]) for r in rows] == [(1, 1), (1, 4), (2, 1)]
    assert all(r["ms"] > 0 and r["before_ms"] > 0 and r["paired_speedup"] > 0 for r in rows)


@pytest.mark.timeout(600)
def test_phases_with_a_before_kernel_pair_each_phase(tmp_path):
    """--phases --before: the 'before' build's own phase table, and each phase's paired speed-up per shape."""
    r = run("--model", "tiny", "--shapes", "1x1,2x1", "--past", "8", "--past-64", "8", "--reps", "3",
            "--before", str(SOURCE), "--phases", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    table = (tmp_path / "table.md").read_text()
    assert "Where the time goes ('before' backend" in table
    assert "Each phase, 'now' against 'before'" in table
    record = json.loads((tmp_path / "results.json").read_text())
    assert list(record["phases_ms"]) == list(record["phases_ms_before"]) == ["1x1", "2x1"]
    # the read bandwidth probed after every rep, and each build's 1x1 step against its own rep's reading
    assert len(record["stream_GBps_each_rep"]) == 3 and all(g > 0 for g in record["stream_GBps_each_rep"])
    assert set(record["one_token_share_of_stream"]) == {"now", "before"}
    assert "Read bandwidth probed after each rep's forwards: median" in table
    paired = record["phases_paired_speedup"]
    assert list(paired) == ["1x1", "2x1"]
    for ratios in paired.values():  # the same build twice: every ratio a positive number, the forward's there
        assert ratios["total"] > 0 and "attention" in ratios and all(v > 0 for v in ratios.values())


def test_paired_phase_ratios_take_each_reps_ratio_and_skip_zero_phases():
    from recguide_trt.bench.forward_cost import paired_phase_ratios

    before = [{"total": 20.0, "attention": 4.0, "head": 0.0}, {"total": 22.0, "attention": 6.0, "head": 0.0},
              {"total": 9.0, "attention": 1.0, "head": 0.0}]
    now = [{"total": 10.0, "attention": 2.0, "head": 0.0}, {"total": 11.0, "attention": 2.0, "head": 0.0},
           {"total": 10.0, "attention": 2.0, "head": 0.0}]
    r = paired_phase_ratios(before, now)
    assert r["total"] == pytest.approx(2.0) and r["attention"] == pytest.approx(2.0)  # medians of 2, 2, 0.9 / 2, 3, 0.5
    assert "head" not in r


def test_paired_speedup_is_the_median_of_each_reps_ratio():
    """A burst that slows one backend's reps moves the ratio of bests; the median of per-rep ratios holds."""
    from recguide_trt.bench.forward_cost import ShapeCost, paired_ratio

    def cost(reps):
        return ShapeCost(1, 1, 0, min(reps), 1, 1.0, tuple(reps))

    before, now = cost([20.0, 21.0, 22.0, 10.0]), cost([10.0, 10.5, 11.0, 9.0])
    assert paired_ratio(before, now) == pytest.approx(2.0)  # ratios 2, 2, 2, 1.11
    assert before.ms / now.ms == pytest.approx(10 / 9)


@pytest.mark.timeout(600)
def test_kv_bf16_column_and_its_phases(tmp_path):
    """--kv-bf16: float32 arithmetic over a bf16 KV cache as a column of its own, and with --phases its own table."""
    r = run("--model", "tiny", "--shapes", "1x1,2x1", "--past", "8", "--reps", "1", "--kv-bf16", "--phases",
            "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    table = (tmp_path / "table.md").read_text()
    assert "| kv16 ms |" in table and "'kv16': float32 arithmetic over a bfloat16 KV cache." in table
    assert "Where the time goes ('now' backend" in table and "Where the time goes ('kv16' backend" in table
    record = json.loads((tmp_path / "results.json").read_text())
    assert all(r["kv16_ms"] > 0 for r in record["rows"])
    assert list(record["phases_ms"]) == list(record["phases_ms_kv16"]) == ["1x1", "2x1"]
    assert all(ph["attention"] >= 0 and ph["total"] > 0 for ph in record["phases_ms_kv16"].values())
    bad = run("--model", "tiny", "--kv-bf16", "--ab-dtype", "bfloat16", "--out", str(tmp_path))
    assert bad.returncode != 0 and "--kv-bf16" in bad.stderr


@pytest.mark.timeout(600)
def test_prefill_shapes(tmp_path):
    """--prefill times prompt prefills: no past, and the head's FLOPs on each prompt's last token only."""
    r = run("--model", "tiny", "--shapes", "1x1,2x6", "--reps", "1", "--prefill", "--phases", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    table = (tmp_path / "table.md").read_text()
    assert "Shapes are prompt prefills" in table
    # --phases: the backend's phase timers per shape, which add up to no more than the forward's wall time
    assert "Where the time goes" in table and "| 2x6 |" in table.split("Where the time goes")[1]
    phases = json.loads((tmp_path / "results.json").read_text())["phases_ms"]
    assert list(phases) == ["1x1", "2x6"]
    for ph in phases.values():
        parts = [v for k, v in ph.items() if k != "total"]
        assert {"attention", "mlp", "head"} <= set(ph) and all(v >= 0 for v in parts)
        assert 0 < sum(parts) <= ph["total"] * 1.01
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(tuple(r["shape"]), r["past"]) for r in rows] == [((1, 1), 0), ((2, 6), 0)]
    from recguide_trt.bench.forward_cost import forward_flops
    from recguide_trt.model.checkpoint import load_checkpoint
    from recguide_trt.models import resolve_model

    model = load_checkpoint(resolve_model("tiny"), dtype="float32", load_adapter=False).model
    flops = rows[1]["gflops"] * rows[1]["ms"] * 1e6
    assert flops == pytest.approx(forward_flops(model, 2, 6, 0, prefill=True), rel=1e-6)
    assert forward_flops(model, 2, 6, 0, prefill=True) < forward_flops(model, 2, 6, 0)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["draft", "fused"])
def test_draft_and_fused_rows(tmp_path, kind):
    """--rows draft/fused: the rows the executor packs, with the adapter on, divided by the AR step timed beside them."""
    r = run("--model", "tiny", "--shapes", "1x4,2x8", "--past", "8", "--reps", "1", "--rows", kind,
            "--before", str(SOURCE), "--phases", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    table = (tmp_path / "table.md").read_text()
    assert list(json.loads((tmp_path / "results.json").read_text())["phases_ms"]) == ["1x4", "2x8", "ar"]
    assert f"Rows are {'draft blocks' if kind == 'draft' else 'fused'}" in table
    assert "the 1-token AR step timed beside them (0.00 ms)" not in table
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [tuple(r["shape"]) for r in rows] == [(1, 4), (2, 8)]
    assert all(r["ms"] > 0 and r["before_ms"] > 0 for r in rows)
    from recguide_trt.bench.forward_cost import draft_batch, forward_flops
    from recguide_trt.model.checkpoint import load_checkpoint
    from recguide_trt.models import resolve_model

    model = load_checkpoint(resolve_model("tiny"), dtype="float32").model
    per_row = 2 if kind == "fused" else 1  # a fused row carries its verify tokens and its draft's
    assert rows[1]["gflops"] * rows[1]["ms"] * 1e6 == pytest.approx(forward_flops(model, 2, 8 * per_row, 8), rel=1e-6)
    b = draft_batch(2, 8, 8, kind, model.config.mask_token_id, model.config.draft_seed_causal)
    assert b.input_ids.shape == (2, 8 * per_row) and b.draft_gate[:, -7:].all()
    assert (b.draft_gate[:, :8] == 0).all() if kind == "fused" else b.draft_gate[:, 1:].all()


def test_bad_values_say_which_option(tmp_path):
    r = run("--ab-dtype", "bfloat16", "--bf16", "--out", str(tmp_path))
    assert r.returncode == 2 and "--ab-dtype bfloat16 already times bf16" in r.stderr
    r = run("--before", str(tmp_path / "missing.cpp"), "--model", "tiny", "--out", str(tmp_path))
    assert r.returncode != 0 and "--before:" in r.stderr
    r = run("--rows", "draft", "--prefill", "--model", "tiny", "--out", str(tmp_path))
    assert r.returncode == 2 and "--rows draft/fused time rows over a cached past" in r.stderr
    r = run("--shapes", "1xq", "--model", "tiny", "--out", str(tmp_path))
    assert r.returncode != 0 and "--shapes: expected ROWSxTOKENS" in r.stderr


def test_one_token_share_pairs_each_rep_with_the_bandwidth_read_after_it():
    """A rep whose bandwidth reading fell (a neighbour on the memory bus) is judged against that reading."""
    import importlib.util

    from recguide_trt.bench.forward_cost import ShapeCost

    spec = importlib.util.spec_from_file_location("bench_forward", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    gb = int(1e9)  # 1 GB of weights: 10 ms is 100 GB/s
    costs = {("now", (1, 1)): ShapeCost(1, 1, 0, 10.0, gb, 1.0, (10.0, 20.0, 12.5)),
             ("now", (1, 4)): ShapeCost(1, 4, 0, 11.0, gb, 1.0, (11.0, 11.0, 11.0))}
    shares = mod.one_token_shares([200.0, 50.0, 100.0], costs, {"now": None, "other": None})
    assert shares == {"now": pytest.approx(0.8)}  # 100 / 200, 50 / 50, 80 / 100: median 0.8
    assert "now 80 %" in mod.stream_line([200.0, 50.0, 100.0], shares)
    assert mod.stream_line([], shares) == ""
