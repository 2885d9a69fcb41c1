"""The training script runs end to end on a toy config and writes a loadable, lossless checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from recguide_trt import LLM, EngineConfig, SamplingParams
from recguide_trt.runtime.reference import reference_greedy
from tests.conftest import load_script as load_conftest_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_tiny.py"


def load_script():
    return load_conftest_script(SCRIPT, "train_tiny")


def test_toy_training_run_and_resume(tmp_path):
    train = load_script()
    out, work = tmp_path / "ck", tmp_path / "work"
    args = ["--out", str(out), "--work", str(work), "--max-files", "25", "--vocab", "300", "--hidden", "32",
            "--intermediate", "64", "--layers", "2", "--heads", "2", "--kv-heads", "1", "--seq-len", "32",
            "--batch", "4", "--base-steps", "4", "--distill-steps", "3", "--distill-prompts", "16",
            "--distill-prompt-len", "8", "--distill-new", "16", "--distill-batch", "4", "--lora-rank", "4", "--eval-windows", "4",
            "--save-every", "2", "--blocks", "4,8", "--threads", "1",
            "--long-steps", "2", "--long-seq-len", "48", "--long-batch", "2"]
    assert train.main(args) == 0
    report = json.loads((out / "training_report.json").read_text())
    assert report["heldout_bits_per_byte"] > 0 and report["base_steps"] == 4
    assert (out / "linear_spec_lora" / "adapter_config.json").is_file()
    assert json.loads((out / "config.json").read_text())["draft_seed_causal"] is True
    # A second run resumes from the saved state instead of starting over.
    assert train.main(args) == 0
    llm = LLM(out, engine_config=EngineConfig(max_num_seqs=4, max_model_len=128))
    prompt = llm.encode("def add(a, b):\n    return")
    ref, _ = reference_greedy(llm.checkpoint.model, prompt, 16, llm.config.eos_token_id)
    for policy in ("linearspec", "recguide"):
        got = llm.generate([prompt], SamplingParams(max_tokens=16, policy=policy, block_size=4))[0]
        assert got.token_ids == ref


def test_definitions_become_documents():
    train = load_script()
    text = "import os\n\nX = 1\n\n\ndef f(a):\n    return a\n\n\n@dec\nclass C:\n    y = 2\n\nmain()\n"
    assert train.split_definitions(text) == ["import os\n\nX = 1\n\n\ndef f(a):\n    return a\n",
                                             "@dec\nclass C:\n    y = 2\n", "main()\n"]
    assert train.split_definitions("def broken(:\n") == ["def broken(:\n"]


def test_newlines_are_tokens_of_their_own(tmp_path):
    """A prompt ending in a newline must tokenize as it does inside training text."""
    from tokenizers import Tokenizer

    train = load_script()
    files = train.corpus_files(12)[0]
    train.train_tokenizer(files, 400, tmp_path / "tok.json")
    tok = Tokenizer.from_file(str(tmp_path / "tok.json"))
    body = "def f(x):\n    return x\n"
    assert tok.encode(body).ids[:len(tok.encode("def f(x):\n").ids)] == tok.encode("def f(x):\n").ids
    assert tok.decode(tok.encode(body).ids) == body


def test_blocks_below_three_are_rejected(tmp_path):
    train = load_script()
    import pytest

    with pytest.raises(SystemExit, match="block"):
        train.main(["--out", str(tmp_path / "x"), "--blocks", "2,4", "--max-files", "2"])
