"""PROJECTION simulator: the runtime's own policies on a cost and an acceptance model."""

from __future__ import annotations

import argparse

import pytest

from recguide_trt.bench import simulator as S
from recguide_trt.bench.sim_backend import document_prompt, expected_output
from recguide_trt.runtime.policies.ar import ARPolicy
from recguide_trt.runtime.policies.linearspec import LinearSpecPolicy
from recguide_trt.runtime.policies.recguide import RecGuideConfig, RecGuidePolicy


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
    cfg = S.SimConfig(concurrency=(1, 128), blocks=(8, 16, 32), requests=32, per_client=1, max_tokens=192,
                      prompt_len=128)
    cost, acc = S.TableCost(), S.ParametricAcceptance()
    sim = S.make_engine(cfg, cost, acc)
    pols = sim.engine.policies
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
    sim = S.make_engine(cfg, cost, acc)
    prompts = [document_prompt(d, cfg.prompt_len) for d in range(16)]

    def cell():
        sim.backend.begin_cell()
        res = run_cell(sim.engine, prompts, lambda n: SamplingParams(max_tokens=n, policy="linearspec", block_size=8,
                                                                     stop_at_eos=False), 4, 8, 64)
        return [(r.metrics.rounds, r.metrics.accepted_draft_tokens) for r in res.requests], res.throughput

    (rounds1, tp1), (rounds2, tp2) = cell(), cell()
    assert rounds1 == rounds2 and sum(a for _, a in rounds1) > 0
    assert tp1["tokens"] == tp2["tokens"] and abs(tp1["output_tok_s"] / tp2["output_tok_s"] - 1) < 1e-9


def test_simulator_has_no_step_loop_of_its_own():
    """The projection is the engine's: neither the simulator nor its backend plans, steps or emits."""
    import inspect

    from recguide_trt.bench import sim_backend

    for module in (S, sim_backend):
        src = inspect.getsource(module)
        for needle in ("def step(", ".plan(", ".observe(", "def submit(", "def _emit(", "def _retire("):
            assert needle not in src, f"{module.__name__} has {needle!r}"


def _recording_plans(engine, sink: list):
    """Wrap every policy's plan so each step's Works land in ``sink`` (per policy, in order)."""
    for name, pol in engine.policies.items():
        inner = pol.plan

        def plan(requests, ctx, _inner=inner, _name=name):
            works = _inner(requests, ctx)
            sink.append((_name, ctx.concurrency, [(w.kind.value, w.block, w.prospective) for w in works]))
            return works

        pol.plan = plan


@pytest.mark.parametrize("policy", ["recguide", "linearspec"])
def test_one_simulated_cell_plans_what_the_engine_plans(policy):
    """One cell through the simulator's sweep and the same requests driven through a hand-built
    engine over the same simulated outcomes: the plans are equal, step by step."""
    from recguide_trt.bench.loop import run_cell
    from recguide_trt.bench.sim_backend import SimulatedBackend, VirtualClock
    from recguide_trt.runtime.engine import Engine, EngineConfig
    from recguide_trt.runtime.params import SamplingParams

    cfg = S.SimConfig(concurrency=(4,), blocks=(8,), vanilla_block=8, candidate_blocks=(1, 4, 8), requests=8,
                      max_tokens=48, prompt_len=16, policies=(policy,), warmup=False)
    cost, acc = S.TableCost(), S.ParametricAcceptance(seed=3)
    sim = S.make_engine(cfg, cost, acc)
    via_sim: list = []
    _recording_plans(sim.engine, via_sim)
    prompts = [document_prompt(d, cfg.prompt_len) for d in range(cfg.n_docs)]
    from recguide_trt.bench.sweep import policy_specs, run_sweep

    run_sweep(sim, prompts, policy_specs([policy], [8], 8, 8), [4], cfg.requests, cfg.max_tokens, warmup=False,
              progress=False, on_cell_start=sim.backend.begin_cell)

    clock = VirtualClock()
    backend = SimulatedBackend(cost, acc, clock, max_slots=4, slot_capacity=64 + 16)
    ec = EngineConfig(max_num_seqs=4, max_model_len=64, max_block_size=8,
                      recguide=RecGuideConfig(candidate_blocks=(1, 4, 8)),
                      cost_table=S.cost_table_from(cost, 16 + 24))
    engine = Engine(backend, S.model_config(S.MODELS["nld-8b"], 8), ec, clock=clock)
    direct: list = []
    _recording_plans(engine, direct)
    # The sweep's calibration request, then the cell.
    engine.submit(prompts[0], SamplingParams(max_tokens=8, policy="recguide" if policy == "recguide" else "ar"))
    engine.run_until_done()
    backend.begin_cell()
    res = run_cell(engine, prompts, lambda n: SamplingParams(max_tokens=n, policy=policy, stop_at_eos=False,
                                                             block_size=8 if policy == "linearspec" else None),
                   4, 8, 48, warmup=False)
    assert len(direct) > 20 and direct == via_sim
    assert any(kind == "draft" for _, _, works in direct for kind, _, _ in works)
    for r in res.requests:
        assert r.output_ids == expected_output(r.prompt_ids, 48)


@pytest.mark.parametrize("policy", ["ar", "linearspec", "recguide"])
def test_simulated_requests_decode_the_truth(policy):
    """Lossless on the simulated backend: every policy emits the documents' known greedy tokens."""
    cfg = S.SimConfig(concurrency=(1, 8), blocks=(8,), vanilla_block=8, candidate_blocks=(1, 4, 8), requests=8,
                      max_tokens=40, prompt_len=8, policies=(policy,))
    sim = S.make_engine(cfg, S.TableCost(), S.ParametricAcceptance())
    done = []
    from recguide_trt.bench.loop import run_cell
    from recguide_trt.runtime.params import SamplingParams

    prompts = [document_prompt(d, cfg.prompt_len) for d in range(64)]
    for C in (1, 8):
        res = run_cell(sim.engine, prompts, lambda n: SamplingParams(max_tokens=n, policy=policy, stop_at_eos=False,
                                                                     block_size=8 if policy == "linearspec" else None),
                       C, 8, 40)
        done += res.requests
    assert len(done) == 16
    for r in done:
        assert r.output_ids == expected_output(r.prompt_ids, 40)
    assert sim.clock.now > 0 and sim.backend.forwards > 0
