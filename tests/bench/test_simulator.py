"""PROJECTION simulator: the runtime's own policies on a cost and an acceptance model."""

from __future__ import annotations

import argparse

from recguide_trt.bench import simulator as S
from recguide_trt.runtime.policies.ar import ARPolicy
from recguide_trt.runtime.policies.linearspec import LinearSpecPolicy
from recguide_trt.runtime.policies.recguide import RecGuidePolicy


def test_table_cost_reproduces_b200_rounds():
    cost = S.TableCost()
    for C, row in S.B200_ROUND_MS.items():
        for L, ms in row.items():
            assert abs(2e3 * cost.forward_time([(512, L)] * C) - ms) / ms < 0.06


def test_parametric_acceptance_matches_nld8b():
    acc = S.ParametricAcceptance()
    for L, t in acc.fitted().items():
        assert abs(t - S.NLD8B_TOKENS_PER_ROUND[L]) / S.NLD8B_TOKENS_PER_ROUND[L] < 0.03


def test_best_fixed_block_moves_32_to_8_with_real_policies(monkeypatch):
    calls = {"plan": 0, "observe": 0}
    orig_plan, orig_observe = RecGuidePolicy.plan, RecGuidePolicy.observe

    def plan(self, requests, ctx):
        calls["plan"] += 1
        return orig_plan(self, requests, ctx)

    def observe(self, request, outcome, hit, would_hit=None):
        calls["observe"] += 1
        return orig_observe(self, request, outcome, hit, would_hit)

    monkeypatch.setattr(RecGuidePolicy, "plan", plan)
    monkeypatch.setattr(RecGuidePolicy, "observe", observe)
    cfg = S.SimConfig(concurrency=(1, 128), blocks=(8, 16, 32), requests=4, per_client=1, max_tokens=192,
                      prompt_len=128)
    cost, acc = S.TableCost(), S.ParametricAcceptance()
    pols = S.make_policies(cfg, cost)
    assert isinstance(pols["ar"], ARPolicy) and isinstance(pols["linearspec"], LinearSpecPolicy)
    assert isinstance(pols["recguide"], RecGuidePolicy) and pols["recguide"].cost is not None
    result = S.simulate_sweep(cfg, cost, acc)
    from recguide_trt.bench.report import summarize

    summary = summarize(result["cells"], result["labels"], result["vanilla"], result["fixed"], result["recguide"])
    best = S.best_fixed_blocks(summary)
    assert best[1] == "linearspec-L32" and best[128] == "linearspec-L8"
    assert calls["plan"] > 0 and calls["observe"] > 0
    for cell in result["cells"]:
        assert cell["inflight"] == {"min": cell["C"], "max": cell["C"]}
    # The analytic middle of the published curve: block 16 wins at C = 32.
    rates = {L: S.analytic_fixed(cost, acc, 32, L, 512) for L in (8, 16, 32)}
    assert max(rates, key=rates.get) == 16


def test_cli_prints_projection(tmp_path, capsys):
    args = S.add_simulate_args(argparse.ArgumentParser()).parse_args(
        ["--concurrency", "1,4", "--requests", "2", "--max-tokens", "64", "--no-progress", "--out", str(tmp_path),
         "--cost", "roofline"])
    assert S.run_simulation(args) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines and all("PROJECTION" in line for line in lines)
    table = (tmp_path / "table.md").read_text()
    assert table.startswith("# PROJECTION")
    assert (tmp_path / "pareto.png").is_file() and (tmp_path / "speedup.png").is_file()
