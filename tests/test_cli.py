"""The ``recguide`` command line, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from recguide_trt.cli import main
from tests.conftest import EMBEDDED, has_embedded
from tests.serving.conftest import make_text_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_text_checkpoint(tmp_path_factory.mktemp("cli") / "ck")


def test_generate_prints_completion_and_stats(ckpt, capsys):
    assert main(["generate", "the quick fox", "--model", str(ckpt), "--max-tokens", "8", "--policy", "linearspec",
                 "--block-size", "4", "--stats"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("the quick fox")
    stats = json.loads(err)
    assert stats["output_tokens"] == 8 and "verify" in stats["forwards"]


def test_first_recguide_run_says_it_measures_the_cost_table(ckpt, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("RECGUIDE_CACHE", str(tmp_path))
    argv = ["generate", "the quick fox", "--model", str(ckpt), "--max-tokens", "4", "--policy", "recguide"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.startswith("the quick fox")
    assert "recguide: measuring the step-cost table" in err and "step-cost table measured in" in err
    assert main(argv) == 0                       # cached now: nothing to say
    assert "step-cost table" not in capsys.readouterr().err


def test_generate_stream(ckpt, capsys):
    assert main(["generate", "def main", "--model", str(ckpt), "--max-tokens", "6", "--stream",
                 "--policy", "ar"]) == 0
    assert capsys.readouterr().out.startswith("def main")


@pytest.mark.parametrize("argv,needle", [
    (["generate", "x", "--max-tokens", "0"], "max_tokens must be a positive integer"),
    (["generate", "", "--max-tokens", "4"], "prompt is empty"),
    (["generate", "x", "--block-size", "1"], "block_size must be an integer >= 2"),
    (["generate", "x", "--logprobs", "21"], "logprobs must be an integer in [0, 20]"),
    (["generate", "x", "--repetition-penalty", "0"], "repetition_penalty must be > 0"),
    (["generate", "x", "--stop-token-id", "-4"], "stop_token_ids must be made of token ids"),
    (["generate", "x", "--top-k", "-3"], "top_k must be an integer >= -1"),
])
def test_generate_bad_input_is_one_clear_line(ckpt, capsys, argv, needle):
    assert main(argv + ["--model", str(ckpt)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_export_writes_graph_and_manifest(ckpt, tmp_path, capsys):
    """`recguide export` with its options (the default export is tests/engine/test_export.py's)."""
    pytest.importorskip("onnxscript")
    from recguide_trt.engine.manifest import ExportManifest

    assert main(["export", "--model", str(ckpt), "--out", str(tmp_path / "exp"), "--block-sizes", "2,4",
                 "--max-batch", "4", "--no-mismatch-op"]) == 0
    assert (tmp_path / "exp" / "manifest.json").is_file() and (tmp_path / "exp" / "model.onnx").is_file()
    manifest = ExportManifest.load(tmp_path / "exp")
    assert manifest.block_sizes == [2, 4] and manifest.profiles["verify"].batch.max == 4
    assert manifest.custom_ops == []
    assert "profile draft" in capsys.readouterr().out


def test_missing_model_dir(tmp_path, capsys):
    assert main(["generate", "x", "--model", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_profile_writes_chrome_trace(ckpt, tmp_path, capsys):
    out = tmp_path / "trace.json"
    assert main(["profile", "--model", str(ckpt), "--requests", "3", "--max-tokens", "6", "--out", str(out),
                 "--policy", "linearspec", "--block-size", "4"]) == 0
    names = {e["name"] for e in json.loads(out.read_text())["traceEvents"]}
    assert {"schedule", "draft", "verify", "accept"} <= names


@pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")
def test_console_script_on_the_embedded_model():
    res = subprocess.run([sys.executable, "-m", "recguide_trt.cli", "generate", "def fibonacci(n):",
                          "--max-tokens", "24"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("def fibonacci(n):") and len(res.stdout) > len("def fibonacci(n):") + 5
    assert EMBEDDED.is_dir()


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
def test_bf16_compute_and_kv_cache_flags_through_the_console_script():
    """`recguide generate --compute-dtype bfloat16 --kv-cache-dtype bfloat16`: LinearSpec's text equals AR's
    under the same options; a bad value is one clear argparse line."""
    def run(*extra):
        return subprocess.run([sys.executable, "-m", "recguide_trt.cli", "generate", "def add(a, b):", "--model", "tiny",
                               "--max-tokens", "24", "--compute-dtype", "bfloat16", "--kv-cache-dtype", "bfloat16",
                               *extra], capture_output=True, text=True, timeout=300)

    ar, spec = run("--policy", "ar"), run("--policy", "linearspec", "--block-size", "4", "--stats")
    assert ar.returncode == 0 and spec.returncode == 0, ar.stderr + spec.stderr
    assert spec.stdout == ar.stdout and len(ar.stdout) > len("def add(a, b):")
    assert json.loads(spec.stderr[spec.stderr.index("{"):])["output_tokens"] == 24
    bad = run("--kv-cache-dtype", "fp8")
    assert bad.returncode == 2 and "--kv-cache-dtype: invalid choice: 'fp8'" in bad.stderr


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
def test_generate_logprobs_through_the_console_script():
    """`recguide generate --logprobs N`: one stderr line per output token, the same streamed under RecGuide as under
    AR."""
    def run(*extra):
        return subprocess.run([sys.executable, "-m", "recguide_trt.cli", "generate", "def add(a, b):", "--model", "tiny",
                               "--max-tokens", "12", "--logprobs", "2", *extra], capture_output=True, text=True,
                              timeout=300)

    def lines(res):
        assert res.returncode == 0, res.stderr
        return [ln for ln in res.stderr.splitlines() if not ln.startswith("recguide:")]

    ar = lines(run("--policy", "ar"))
    assert len(ar) == 12 and all(ln.count("' -") == 2 for ln in ar)  # the token's two alternatives, with logprobs
    assert lines(run("--policy", "recguide", "--stream")) == ar  # LinearSpec's: tests/runtime/test_logprobs.py


@pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
def test_generate_penalties_and_stop_through_the_console_script():
    """`recguide generate --repetition-penalty --presence-penalty --min-tokens --stop`, streamed under RecGuide: the
    text AR gives through the API with the same settings, cut before the stop string (not the text without them)."""
    from recguide_trt import LLM, SamplingParams

    llm = LLM("tiny")
    prompt = "def add(a, b):"
    settings = dict(repetition_penalty=1.3, presence_penalty=0.5, min_tokens=8)
    ar = llm.generate([prompt], SamplingParams(max_tokens=24, policy="ar", **settings))[0].text
    assert ar != llm.generate([prompt], SamplingParams(max_tokens=24, policy="ar"))[0].text
    stop = ar[10:13]
    res = subprocess.run([sys.executable, "-m", "recguide_trt.cli", "generate", prompt, "--model", "tiny",
                          "--max-tokens", "24", "--policy", "recguide", "--stream", "--repetition-penalty", "1.3",
                          "--presence-penalty", "0.5", "--min-tokens", "8", "--stop", stop],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout == prompt + ar[:ar.index(stop)] + "\n"
