"""scripts/bench_peers.py's command line, as a user runs it, and the rows it picks (no peers, nothing benchmarked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import load_script as load_conftest_script

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "bench_peers.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_help_lists_the_options():
    r = run("--help")
    assert r.returncode == 0, r.stderr
    for opt in ("--dir", "--out", "--rounds", "--serial-prompts", "--batch-prompts", "--tokens", "--spin",
                "--backends", "--peers"):
        assert opt in r.stdout


def test_bad_option_is_an_error():
    r = run("--no-such-option")
    assert r.returncode == 2 and "unrecognized arguments: --no-such-option" in r.stderr


def test_bad_values_say_what_to_change():
    r = run("--rounds", "0")
    assert r.returncode == 2 and "--rounds must be >= 1" in r.stderr
    r = run("--peers", "Nonesuch")
    assert r.returncode == 2 and "--peers: choose from" in r.stderr


def load_script():
    return load_conftest_script(SCRIPT, "bench_peers_script")


def test_model_option():
    r = run("--help")
    for opt in ("--model", "--spec-peers", "--snippet-chars"):
        assert opt in r.stdout
    r = run("--model", "no-such-model")
    assert r.returncode == 2 and "--model: 'no-such-model' is neither a model name" in r.stderr
    bp = load_script()
    assert bp.parse_args([]).model == "tiny"  # the default is the embedded model, as before
    a = bp.parse_args(["--model", "smollm2-135m", "--backends", "torch", "--no-default", "--peers", "transformers"])
    rows = bp.select_rows(a)
    assert [r.opts for r in rows if r.ours] == [{"backend": "torch", "model": "smollm2-135m"}] * 3
    assert [r.label for r in rows if not r.ours] == ["transformers"]


def test_model_files_lie_beside_the_embedded_models():
    from recguide_trt.bench.peers.rows import model_files

    assert model_files(Path("/p")) == Path("/p") and model_files(Path("/p"), "tiny") == Path("/p")
    assert model_files(Path("/p"), "smollm2-135m") == Path("/p/smollm2-135m")
    assert model_files(Path("/p"), "/ckpts/my-model") == Path("/p/my-model")


def test_speculation_rows_only_when_asked():
    from recguide_trt.bench.peers.rows import PEER_SPEC, PEERS, peer_rows

    assert [r.label for r in peer_rows()] == list(PEERS)
    spec = peer_rows(["OpenVINO GenAI", "vLLM CPU"], spec=True)
    assert [r.label for r in spec] == ["OpenVINO GenAI", "vLLM CPU", "OpenVINO GenAI prompt lookup", "vLLM CPU ngram"]
    assert spec[2].opts == PEER_SPEC["OpenVINO GenAI prompt lookup"][2] and spec[2].opts["prompt_lookup"] > 0
    assert [r.label for r in peer_rows(["llama.cpp prompt lookup"])] == ["llama.cpp prompt lookup"]
    r = run("--peers", "OpenVINO GenAI prompt lookup,nope")
    assert r.returncode == 2 and "--peers: choose from" in r.stderr


def test_kv16_adds_our_rows_over_a_bf16_kv_cache_and_policies_still_select():
    """--kv16: our rows again with float32 arithmetic over a bf16 KV cache, labelled kv16; --policies keeps a
    policy whose label holds a space (linearspec L8) with every suffix."""
    from recguide_trt.bench.peers.rows import OUR_BF16, OUR_KV16

    bp = load_script()
    assert not bp.parse_args([]).kv16
    a = bp.parse_args(["--model", "smollm2-135m", "--backends", "native", "--no-default", "--policies",
                       "ar,linearspec L8", "--peers", "vLLM CPU", "--precision", "default", "--kv16"])
    ours = [(r.label, r.opts) for r in bp.select_rows(a) if r.ours]
    base = {"backend": "native", "model": "smollm2-135m"}
    assert ours == [("ours native ar", base), ("ours native linearspec L8", base),
                    ("ours native ar bf16", {**base, **OUR_BF16}), ("ours native linearspec L8 bf16", {**base, **OUR_BF16}),
                    ("ours native ar kv16", {**base, **OUR_KV16}), ("ours native linearspec L8 kv16", {**base, **OUR_KV16})]
    assert OUR_KV16 == {"kv_cache_dtype": "bfloat16"}  # float32 arithmetic: no compute_dtype


def test_precision_default_runs_the_peers_as_shipped_and_adds_our_bf16_rows():
    from recguide_trt.bench.peers.rows import OUR_BF16, peer_rows

    bp = load_script()
    assert bp.parse_args([]).precision == "float32"  # every engine forced to float32, as before
    a = bp.parse_args(["--model", "smollm2-135m", "--backends", "native", "--no-default", "--policies", "ar",
                       "--peers", "ONNX Runtime GenAI,vLLM CPU", "--precision", "default"])
    rows = bp.select_rows(a)
    assert [(r.label, r.opts) for r in rows if r.ours] == [
        ("ours native ar", {"backend": "native", "model": "smollm2-135m"}),
        ("ours native ar bf16", {"backend": "native", "model": "smollm2-135m", **OUR_BF16})]
    # ONNX Runtime GenAI's precision is its export's: no "(default)" row of its own
    assert [(r.label, r.opts) for r in rows if not r.ours] == [("ONNX Runtime GenAI", {}),
                                                               ("vLLM CPU (default)", {"precision": "default"})]
    spec = peer_rows(["vLLM CPU ngram"], precision="default")
    assert spec[0].label == "vLLM CPU ngram (default)" and spec[0].opts["precision"] == "default"
    assert spec[0].opts["prompt_lookup"] > 0
    r = run("--precision", "bf16")
    assert r.returncode == 2 and "--precision: invalid choice: 'bf16'" in r.stderr
    try:
        peer_rows(precision="half")
    except ValueError as exc:
        assert "precision must be one of" in str(exc)
    else:
        raise AssertionError("peer_rows accepted precision='half'")
