"""The peers' speculation settings: tuned on training prompts, recorded per model, used by bench_peers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recguide_trt.bench.peers import spec_tuning
from recguide_trt.bench.peers.rows import PEER_SPEC, peer_rows

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "tune_peer_spec.py"


def test_tune_times_every_point_and_keeps_the_fastest():
    seen = []

    def measure(label, opts):
        seen.append((label, opts["prompt_lookup"], opts["ngram"]))
        if opts["prompt_lookup"] == 8:
            raise RuntimeError("engine refused num_speculative_tokens=8\nsecond line")
        return 100.0 + opts["prompt_lookup"] * 10 - abs(opts["ngram"] - 3)

    results = spec_tuning.tune(["A", "B"], [3, 5, 8], [2, 3], measure, log=lambda s: None)
    assert len(seen) == 12 and set(results) == {"A", "B"}
    top = spec_tuning.best(results["A"])
    assert top.opts == {"prompt_lookup": 5, "ngram": 3} and top.tok_s == 150.0
    failed = [p for p in results["A"] if p.tok_s is None]
    assert len(failed) == 2 and failed[0].error == "engine refused num_speculative_tokens=8"
    assert spec_tuning.best([p for p in results["A"] if p.tok_s is None]) is None


def test_tuned_settings_are_per_model_and_fall_back_to_the_sample(tmp_path):
    path = tmp_path / "tuned.json"
    sample = {"prompt_lookup": 5, "ngram": 3}
    assert spec_tuning.spec_options("X", "m", sample, path) == sample
    spec_tuning.save_tuned("m", {"X": {"prompt_lookup": 8, "ngram": 2}}, {"command": "c"}, path)
    assert spec_tuning.spec_options("X", "m", sample, path) == {"prompt_lookup": 8, "ngram": 2}
    assert spec_tuning.spec_options("X", "other", sample, path) == sample
    assert spec_tuning.spec_options("Y", "m", sample, path) == sample
    spec_tuning.save_tuned("m", {"Y": {"prompt_lookup": 3, "ngram": 4}}, {"command": "d"}, path)
    data = json.loads(path.read_text())
    assert set(data["m"]) == {"X", "Y"} and data["_runs"]["m"] == {"X": {"command": "c"}, "Y": {"command": "d"}}


def test_bench_rows_use_the_recorded_settings():
    tuned = spec_tuning.load_tuned()
    for model, settings in tuned.items():
        if model.startswith("_"):
            continue
        for label, opts in settings.items():
            assert label in PEER_SPEC and set(opts) == {"prompt_lookup", "ngram"}
            (row,) = peer_rows([label], model=model)
            assert row.opts == opts
    (row,) = peer_rows(["vLLM CPU ngram"], model="a-model-nobody-tuned")
    assert row.opts == PEER_SPEC["vLLM CPU ngram"][2]


def test_grid_parsing_names_the_option():
    assert spec_tuning.parse_grid("8, 3,5,3", "--ngram") == [3, 5, 8]
    for bad in ("", "0,2", "a"):
        with pytest.raises(ValueError, match="--ngram: expected comma-separated positive integers"):
            spec_tuning.parse_grid(bad, "--ngram")


@pytest.mark.parametrize("args, message", [
    (["--workload", "chat-code"], "--workload: tune on a training-split workload"),
    (["--peers", "vLLM CPU"], "--peers: choose from"),
    (["--prompt-lookup", "x"], "--prompt-lookup: expected comma-separated positive integers"),
    (["--rounds", "0"], "--rounds must be >= 1"),
])
def test_script_refuses_bad_options(args, message):
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and message in r.stderr, r.stderr[-1000:]
