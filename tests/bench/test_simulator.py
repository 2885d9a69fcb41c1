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


def test_cells_share_their_random_draws():
    """Common random numbers: a cell's k-th request draws the same rounds whichever cell it is in,
    so two cells of one fixed policy come out identical and policies differ only by themselves."""
    from recguide_trt.bench.loop import run_cell
    from recguide_trt.runtime.params import SamplingParams

    cfg = S.SimConfig(concurrency=(4,), blocks=(8,), requests=8, max_tokens=64, prompt_len=32)
    cost, acc = S.TableCost(), S.ParametricAcceptance()
    sim = S.SimEngine(cost, acc, S.make_policies(cfg, cost))
    prompts = [[d] * cfg.prompt_len for d in range(16)]

    def cell():
        sim.begin_cell()
        res = run_cell(sim, prompts, lambda n: SamplingParams(max_tokens=n, policy="linearspec", block_size=8,
                                                              stop_at_eos=False), 4, 8, 64)
        return [(r.metrics.rounds, r.metrics.accepted_draft_tokens) for r in res.requests], res.throughput

    (rounds1, tp1), (rounds2, tp2) = cell(), cell()
    assert rounds1 == rounds2 and sum(a for _, a in rounds1) > 0
    assert tp1["tokens"] == tp2["tokens"] and abs(tp1["output_tok_s"] / tp2["output_tok_s"] - 1) < 1e-9
