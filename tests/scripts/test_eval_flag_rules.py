"""The flag-rule evaluation replays the rounds the runtime runs and writes its report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recguide_trt import LLM, EngineConfig, SamplingParams
from recguide_trt.bench.loop import record_rounds
from tests.conftest import has_embedded
from tests.conftest import load_script as load_conftest_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "eval_flag_rules.py"
pytestmark = pytest.mark.skipif(not has_embedded(), reason="needs the embedded model")


def load_script():
    return load_conftest_script(SCRIPT, "eval_flag_rules")


def replay_is_the_engine(script, llm, sampler=None) -> tuple[list, list]:
    """Replays one prompt's L8 rounds and runs the engine on it: the accepted counts must be the engine's.
    Returns the replayed rounds and their accepted counts."""
    prompt = llm.encode("def parse_args(argv):\n    parser = argparse.ArgumentParser()\n")
    cont = llm.generate([prompt], SamplingParams(max_tokens=96, policy="ar"))[0].token_ids
    rounds = list(script.drafted_rounds(llm, prompt, cont, 8, sampler))
    replay = [(o[0] - 1 if o[0] > 0 else 7) for *_, o, _ in rounds]
    sink: dict = {}
    with record_rounds(llm.engine.policies, sink):
        out = llm.generate([prompt], SamplingParams(max_tokens=96, policy="linearspec", block_size=8))[0]
    engine = [acc for block, acc, _, _ in next(iter(sink.values())) if block == 8]
    assert out.token_ids == cont
    assert len(replay) >= 5 and engine[:len(replay)] == replay
    return rounds, replay


def test_replayed_rounds_are_the_engines_rounds():
    replay_is_the_engine(load_script(), LLM("tiny", engine_config=EngineConfig(max_num_seqs=2, max_model_len=512)))


def test_report_files(tmp_path):
    script = load_script()
    assert script.main(["--prompts", "3", "--max-tokens", "32", "--blocks", "8", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "flag_rules_train.json").read_text())
    rates = report["L8"]["hit_rate"]
    assert report["draft_sampler"] is True  # the default model (SmolLM2) ships one: its bets are scored too
    assert set(rates) == {"threshold tau=0.3", "threshold tau=0.5", "threshold tau=0.7", "threshold tau=0.9",
                          "likelihood", "likelihood, top 2", "likelihood, rank 3 scored",
                          "likelihood, sampler's probabilities"}
    assert report["L8"]["rounds"] > 0 and all(0.0 <= r <= 1.0 for r in rates.values())
    assert rates["likelihood, top 2"] >= rates["likelihood"]     # its first bet is the likelihood rule's
    assert "likelihood" in (tmp_path / "flag_rules_train.md").read_text()
    assert script.main(["--blocks", "2", "--out", str(tmp_path)]) == 2


def test_replayed_rounds_draft_through_the_sampler_as_the_engine_does():
    """With a draft sampler the replay drafts d2 on as the executor does: the same rounds, the same cuts."""
    import numpy as np

    from tests.runtime.helpers import random_weights

    script = load_script()
    llm = LLM("tiny", engine_config=EngineConfig(max_num_seqs=2, max_model_len=512))
    # the stand-in ships no sampler: a random one, built from its weights as LLM builds a checkpoint's
    llm._checkpoint.draft_sampler = random_weights(np.random.default_rng(0), hidden=llm.config.hidden_size, width=8,
                                                   scale=2.0)
    sampler = llm.engine.executor.sampler = llm._draft_sampler()
    rounds, replay = replay_is_the_engine(script, llm, sampler)
    llm.engine.executor.sampler = None
    _, plain = replay_is_the_engine(script, llm)
    assert plain != replay  # the sampler drafted other tokens
    for top_ids, top_probs, drafted, after, _, first in rounds:
        assert top_probs.shape == (8, 3) and after.shape == (8, 3) and first == 2
        assert all(drafted[i] in top_ids[i] for i in range(2, 8))  # each a candidate of its position
        np.testing.assert_allclose(after[:2], top_probs[:2])
