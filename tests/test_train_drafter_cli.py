"""``recguide train-drafter`` as users run it (the console script), on the embedded stand-in: it trains,
resumes, writes an adapter the loader reads, keeps speculation lossless, and refuses bad settings.

A few steps of rank 2 only: this checks the command, not the drafter's quality (the shipped SmolLM2
adapter's report and ``scripts/eval_model.py`` measure that).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from recguide_trt import LLM, SamplingParams
from tests.conftest import EMBEDDED, has_embedded
from tests.serving.openai_server import recguide_command

pytestmark = pytest.mark.skipif(not has_embedded(), reason="embedded model missing")
ENV = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
SMALL = ["--model", "tiny", "--prompts", "6", "--heldout", "3", "--new-tokens", "40", "--rank", "2",
         "--eval-every", "2", "--blocks", "4,8"]


def recguide(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*recguide_command(), *args], capture_output=True, text=True, env=ENV, timeout=timeout)


def test_trains_resumes_and_stays_lossless(tmp_path):
    out = tmp_path / "drafter"
    first = recguide("train-drafter", *SMALL, "--out", str(out), "--steps", "2")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "train-drafter" in first.stderr  # the progress bar
    report = json.loads((out / "training_report.json").read_text())
    assert report["steps_done"] == 2 and report["train_prompts"] > 0
    again = recguide("train-drafter", *SMALL, "--out", str(out), "--steps", "4")  # same work dir: resumes
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming at step 2 of 4" in again.stderr
    report = json.loads((out / "training_report.json").read_text())
    assert report["steps_done"] == 4 and [h["step"] for h in report["history"]] == [0, 2, 4]
    assert {"tf_mal@4", "tf_mal@8"} <= set(report["history"][-1])
    adapter = out / "linear_spec_lora"
    assert {"adapter_config.json", "adapter_model.safetensors", "draft_embedding.safetensors",
            "draft_sampler.safetensors"} <= {p.name for p in adapter.iterdir()}
    sampler = report["sampler"]  # trained after the adapter, on the drafts of its training prompts
    mal = sampler["heldout_teacher_forced_mal"]
    assert sampler["block"] == 8 and sampler["positions"] > 0 and set(mal) == {"before", "after", "oracle_top2",
                                                                             "oracle_top3"}
    assert mal["before"] <= mal["oracle_top2"] <= mal["oracle_top3"] and mal["after"] <= mal["oracle_top3"]
    assert "Draft sampler:" in (out / "training_report.md").read_text()

    model = tmp_path / "tiny-with-drafter"  # the stand-in with the new adapter in place of its own
    shutil.copytree(EMBEDDED, model)
    shutil.rmtree(model / "linear_spec_lora")
    shutil.copytree(adapter, model / "linear_spec_lora")
    llm = LLM(str(model), max_num_seqs=4)
    assert llm.checkpoint.model.draft_mask_embedding is not None
    assert llm.engine.executor.sampler is not None  # the drafts below go through it
    prompts = ["def add(a, b):", "class Stack:\n", "import os\n\n\ndef walk(path):", "for i in range(10):"]
    ar = llm.generate(prompts, SamplingParams(max_tokens=24, policy="ar"))
    spec = llm.generate(prompts, SamplingParams(max_tokens=24, policy="linearspec", block_size=8))
    assert [o.token_ids for o in spec] == [o.token_ids for o in ar]


def test_bad_settings_are_named(tmp_path):
    bad = recguide("train-drafter", "--model", "tiny", "--out", str(tmp_path / "x"), "--blocks", "2,8")
    assert bad.returncode == 2 and "blocks" in bad.stderr and "Traceback" not in bad.stderr
    bad = recguide("train-drafter", "--model", "tiny", "--out", str(tmp_path / "x"), "--targets", "qkv")
    assert bad.returncode == 2 and "targets" in bad.stderr and "Traceback" not in bad.stderr
    bad = recguide("train-drafter", "--model", "tiny", "--out", str(tmp_path / "x"), "--steps", "0")
    assert bad.returncode == 2 and "steps" in bad.stderr and "init" in bad.stderr and "Traceback" not in bad.stderr


def test_steps_0_trains_a_sampler_for_an_adapter_as_it_is(tmp_path):
    out = tmp_path / "with-sampler"
    init = EMBEDDED / "linear_spec_lora"
    run = recguide("train-drafter", *SMALL, "--rank", "32", "--alpha", "64", "--init", str(init), "--steps", "0",
                   "--sampler-epochs", "1", "--out", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "sampler drafts (train)" in run.stderr  # its progress bars
    adapter = out / "linear_spec_lora"
    assert (adapter / "adapter_model.safetensors").read_bytes() == (init / "adapter_model.safetensors").read_bytes()
    report = json.loads((out / "training_report.json").read_text())
    assert report["steps_done"] == 0 and report["sampler"]["epochs"] == 1


def test_fine_tunes_an_adapter_with_the_loss_levers(tmp_path):
    """--init starts from an existing adapter (the stand-in's own r32 one); the levers land in the report."""
    out = tmp_path / "tuned"
    run = recguide("train-drafter", *SMALL, "--rank", "32", "--alpha", "64", "--init",
                   str(EMBEDDED / "linear_spec_lora"), "--prefix-only", "--kl-weight", "0.5", "--last-weight", "1",
                   "--out", str(out), "--steps", "2")
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads((out / "training_report.json").read_text())
    assert report["config"]["loss"] == {"first_weight": 1.0, "last_weight": 1.0, "prefix_only": True,
                                        "kl_weight": 0.5}
    assert report["config"]["init"] == str(EMBEDDED / "linear_spec_lora")
    # Started from a trained adapter, not from zero: the step-0 MAL is the stand-in's own, above d1 alone.
    assert report["history"][0]["tf_mal@8"] > 2.2
    assert "KL to the frozen AR logits" in (out / "training_report.md").read_text()


def test_bad_init_and_loss_settings_are_named(tmp_path):
    adapter = str(EMBEDDED / "linear_spec_lora")
    bad = recguide("train-drafter", *SMALL, "--out", str(tmp_path / "a"), "--init", adapter)  # rank 2 asked
    assert bad.returncode == 2 and "init" in bad.stderr and "rank-32" in bad.stderr, bad.stderr[-1000:]
    assert "Traceback" not in bad.stderr
    bad = recguide("train-drafter", *SMALL, "--out", str(tmp_path / "b"), "--init", str(tmp_path))
    assert bad.returncode == 2 and "init" in bad.stderr and "Traceback" not in bad.stderr
    bad = recguide("train-drafter", *SMALL, "--out", str(tmp_path / "c"), "--kl-weight", "-1")
    assert bad.returncode == 2 and "kl_weight" in bad.stderr and "Traceback" not in bad.stderr


def test_a_block_longer_than_every_continuation_is_named(tmp_path):
    """Continuations of at most 6 tokens hold a block of 4 but none of 8: named before any training
    step, not a crash at the first step of block 8."""
    bad = recguide("train-drafter", *SMALL, "--new-tokens", "6", "--out", str(tmp_path / "x"), "--steps", "2")
    assert bad.returncode != 0 and "block(s) [8]" in bad.stderr and "--new-tokens" in bad.stderr, bad.stderr[-1000:]
    assert "Traceback" not in bad.stderr
