"""scripts/check_real_model_paths.py's CPU-runnable parts: the ``lossless`` and ``costs`` sections that
scripts/gpu_check.sh runs on torch CUDA with the real model, here on the CPU with the tiny model."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from recguide_trt.runtime.cost_model import CostTable

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_real_model_paths.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("check_real_model_paths", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


def test_lossless_and_costs_sections_on_cpu(script, capsys):
    rc = script.main(["--model", "tiny", "--device", "cpu", "--backend", "torch", "--cost-table", "synthetic",
                      "--max-tokens", "8", "--chat-prompts", "1", "--code-prompts", "1", "--max-cost-batch", "2",
                      "--cost-tokens", "1,4", "lossless", "costs"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "parity: lossless: OK (10 policies x 2 prompts on cpu/torch)" in out
    for label in ("linearspec L=16", "recguide ", "recguide (overlap)", "trtllm-schedule", "sglang-adaptive",
                  "sglang-autospec", "vllm-adaptive-k"):
        assert f"  {label}" in out, label
    table = out[out.index("step-cost table, tiny"):]
    rows = [line.split("|")[0].strip() for line in table.splitlines()[3:5]]
    assert rows == ["1", "2"] and "T=4" in table


def test_divergences_are_found_with_their_margin(script):
    from recguide_trt import LLM, EngineConfig, SamplingParams

    llm = LLM("tiny", backend="torch", engine_config=EngineConfig(max_num_seqs=2, max_model_len=256,
                                                                  cost_table=script.synthetic_cost_table()))
    ids = [llm.encode("def main():\n"), llm.encode("import os\n")]
    outs = llm.generate(ids, SamplingParams(max_tokens=6, policy="ar"))
    ref = [list(o.token_ids) for o in outs]
    assert not script.compare(llm, ids, ref, outs, "ar", 0.0).divergences
    ref[1][3] = (ref[1][3] + 1) % llm.config.vocab_size
    res = script.compare(llm, ids, ref, outs, "ar", 0.0)
    assert [(d.prompt, d.token) for d in res.divergences] == [(1, 3)]
    assert res.divergences[0].margin == pytest.approx(script.logit_margin(llm.checkpoint.model,
                                                                         ids[1] + outs[1].token_ids[:3]))
    assert res.divergences[0].margin >= 0


def test_format_cost_table(script):
    table = CostTable([1, 64], [1, 8], [[0.001, 0.004], [0.002, 0.010]], {}, plain=[[0.001, 0.003], [0.002, 0.010]])
    lines = script.format_cost_table(table).splitlines()
    assert lines[0].split() == ["C", "|", "T=1", "T=8"]
    assert lines[2].split() == ["1", "|", "1.00", "4.00", "(3.00)"]
    assert lines[3].split() == ["64", "|", "2.00", "10.00"]


def test_unknown_section_is_an_error(script, capsys):
    with pytest.raises(SystemExit) as exc:
        script.main(["gpu"])
    assert exc.value.code == 2 and "unknown section(s) gpu" in capsys.readouterr().err
