"""scripts/compare_drafter_runs.py through a subprocess: the lever table, the comparability notes, bad input."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.scripts.runner import run_script


def report(tmp: Path, name: str, end8: float, steps: int = 120, **loss) -> Path:
    d = tmp / name
    d.mkdir()
    config = {"init": "/a/linear_spec_lora", "prompts": 512, "seed": 0, "lr": 5e-4, "blocks": [4, 8],
              "rank": 16, "alpha": 32.0, "targets": ["q_proj"], "seqs_per_step": 2,
              "loss": {"first_weight": 1.0, "last_weight": 0.5, "prefix_only": False, "kl_weight": 0.0, **loss}}
    (d / "training_report.json").write_text(json.dumps({
        "config": config, "steps_done": steps, "seqs_seen": 2 * steps, "train_minutes": 50.0, "heldout_prompts": 48,
        "cpu": "AMD EPYC", "threads": 1, "autocast_bf16": False,
        "history": [{"step": 0, "tf_mal@4": 3.0, "tf_mal@8": 3.9}, {"step": steps, "tf_mal@4": 3.1, "tf_mal@8": end8}]}))
    return d


def run(*args: str) -> subprocess.CompletedProcess:
    return run_script("compare_drafter_runs.py", *args, timeout=60)


def test_table_gives_each_lever_against_the_control(tmp_path):
    control = report(tmp_path, "control", 3.95)
    kl = report(tmp_path, "kl", 4.00, kl_weight=1.0)
    short = report(tmp_path, "short", 3.90, steps=60, prefix_only=True)
    out = tmp_path / "docs" / "levers.md"
    res = run(f"control={control}", f"kl={kl}", f"short={short}", "--out", str(out))
    assert res.returncode == 0, res.stderr
    rows = {line.split("|")[1].strip(): line for line in res.stdout.splitlines() if line.startswith("| ")}
    assert "+ 1 × KL" in rows["kl"] and "+0.050" in rows["kl"] and "3.900 → 4.000" in rows["kl"]
    assert "prefix + first miss only" in rows["short"] and "-0.050" in rows["short"]
    assert "short is not comparable with control**: steps done differ" in res.stdout
    assert "kl is not comparable" not in res.stdout
    assert out.read_text() == res.stdout


def test_bad_input_is_named(tmp_path):
    res = run(f"x={tmp_path}")
    assert res.returncode == 2 and "training_report.json does not exist" in res.stderr and "Traceback" not in res.stderr
    res = run("nodir")
    assert res.returncode == 2 and "NAME=DIR" in res.stderr
    a = report(tmp_path, "a", 3.9)
    res = run(f"a={a}", "--baseline", "b")
    assert res.returncode == 2 and "--baseline" in res.stderr
    (a / "training_report.json").write_text("{}")
    res = run(f"a={a}")
    assert res.returncode == 2 and "not a train-drafter report" in res.stderr
