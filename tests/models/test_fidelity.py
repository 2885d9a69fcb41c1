"""A short leg of the AR fidelity check on the real default model (SmolLM2-135M-Instruct).

Our greedy AR output must equal transformers' ``LlamaForCausalLM`` on the same (converted) weights,
token for token; ``scripts/check_fidelity.py`` runs the long leg (docs/fidelity/).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recguide_trt.bench import fidelity

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_fidelity.py"


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from recguide_trt.models import resolve_model

    return resolve_model("smollm2-135m")  # imported into the model cache on first use


@pytest.fixture(scope="module")
def hf_dir(model_dir, tmp_path_factory) -> Path:
    return fidelity.convert(model_dir, tmp_path_factory.mktemp("fidelity") / "hf-llama")


@pytest.fixture(scope="module")
def llm(model_dir):
    from recguide_trt import LLM

    return LLM(str(model_dir), max_num_seqs=4)


@pytest.fixture(scope="module")
def hf_model(hf_dir):
    return fidelity.load_transformers(hf_dir)


def test_converted_config_is_smollm2(hf_dir):
    cfg = json.loads((hf_dir / "config.json").read_text())
    # SmolLM2 ties its head to the embeddings; our checkpoint's diffusion_head equals them, so the
    # converter writes the tied form the original checkpoint has (no lm_head tensor).
    assert cfg["rope_theta"] == 1e5 and cfg["tie_word_embeddings"] is True
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 2)
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_key_value_heads"]) == (30, 576, 3)


def test_capital_of_france_token_for_token(llm, hf_model):
    text = llm.chat_prompt([{"role": "user", "content": "What is the capital of France?"}])
    prompt = fidelity.Prompt("chat", text, llm.encode(text))
    ours = fidelity.run_ours(llm, [prompt], 32)[0]
    theirs = fidelity.run_transformers(hf_model, [prompt], 32, eos=2, pad=2)[0][0]
    assert ours == theirs
    assert ours[-1] == 2 and "Paris" in llm.decode(ours)


def test_penalties_and_min_tokens_token_for_token(llm, hf_model):
    """Our repetition penalty and ``min_tokens`` against transformers' ``repetition_penalty`` and
    ``min_new_tokens`` (both ban EOS, both divide a seen token's positive logit): AR and RecGuide."""
    from recguide_trt import SamplingParams

    text = llm.chat_prompt([{"role": "user", "content": "What is the capital of France?"}])
    prompt = fidelity.Prompt("chat", text, llm.encode(text))
    plain = fidelity.run_ours(llm, [prompt], 40)[0]  # = transformers' (test_capital_of_france_token_for_token)
    theirs = fidelity.run_transformers(hf_model, [prompt], 40, eos=2, pad=2, repetition_penalty=1.3,
                                       min_new_tokens=len(plain) + 5)[0][0]
    assert theirs != plain and 2 not in theirs[:len(plain) + 5]
    for policy in ("ar", "recguide"):
        ours = llm.generate([prompt.ids], SamplingParams(max_tokens=40, policy=policy, repetition_penalty=1.3,
                                                         min_tokens=len(plain) + 5))[0].token_ids
        assert ours == theirs, policy


def test_short_leg_has_no_real_mismatch(llm, hf_model):
    prompts = fidelity.build_prompts(llm, 4)
    assert [p.kind for p in prompts] == ["chat", "code", "chat", "code"]
    assert prompts[0].ids[0] == 1 and not prompts[1].text.startswith("<|im_start|>")
    report = fidelity.compare(llm, hf_model, prompts, 32, close_calls=0)  # float64 forwards are slow
    assert len(report.results) == 4 and all(r.min_margin_fp32 >= 0 for r in report.results)
    assert report.ok, report.summary() + "\n" + fidelity.markdown(report)


def test_margin_of_a_forced_divergence(llm, hf_model):
    """The margin code on a divergence we make: transformers' top-1 vs its runner-up at a chat prompt."""
    ids = llm.encode("The three primary colors are")
    margins = fidelity.Margins(hf_model)
    l32, l64 = margins.last_logits(ids)
    top1, top2 = (int(t) for t in l64.topk(2).indices)
    d = fidelity.Divergence(pos=0, theirs=top1, ours=top2)
    margins.fill(d, ids, rel_tol=1e-3)
    assert d.top2_fp64 == [top1, top2] and d.margin_fp64 == pytest.approx(d.top2_margin_fp64)
    assert d.margin_fp64 > 0 and abs(d.margin_fp32 - d.margin_fp64) < 1e-3
    assert d.verdict == ("near-tie" if d.rel_margin <= 1e-3 else "mismatch")
    report = fidelity.compare(llm, hf_model, [fidelity.Prompt("code", "", ids)], 6, close_calls=1)
    (c,) = report.close_calls  # the agreed token with the smallest top-2 margin: float64 agrees (or ties)
    assert c.prompt == 0 and c.margin_fp32 == report.results[0].min_margin_fp32 >= 0
    assert c.margin_fp64 > -1e-3 * max(1.0, abs(c.margin_fp32)), c
    assert fidelity.first_divergence([5, 6, 2], [5, 7, 2]).pos == 1
    assert fidelity.first_divergence([5, 6], [5, 6, 2]) == fidelity.Divergence(pos=2, theirs=2, ours=None)
    assert fidelity.first_divergence([5, 2], [5, 2]) is None


def test_script_runs(hf_dir, tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--prompts", "2", "--max-tokens", "8", "--close-calls", "0",
           "--hf-dir", str(hf_dir), "--out", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1].startswith("2/2 identical; 0 near-ties; 0 real mismatches")
    rep = json.loads((tmp_path / "fidelity.json").read_text())
    assert rep["ok"] and rep["prompts"] == 2 and rep["meta"]["machine"]["cpu"]
    assert "2/2 identical" in (tmp_path / "fidelity.md").read_text()
