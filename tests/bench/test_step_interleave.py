"""``recguide bench --interleave step``: each policy on an engine of its own, the engines stepped in turns, each
timed by a clock that runs only during its own steps."""

from __future__ import annotations

import json

import pytest

from recguide_trt.bench import step_interleave
from recguide_trt.bench.loop import Cell
from recguide_trt.bench.step_interleave import StepClock, run_interleaved
from recguide_trt.runtime.params import SamplingParams
from tests.bench.console import recguide_bench

pytest.importorskip("matplotlib")


class _FakeTime:
    """``time.perf_counter`` of the step clocks, moved only by the engines' steps (:class:`_Costly`)."""

    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now


class _Costly:
    """An engine whose every step takes ``cost`` seconds of the fake time; records the order of all steps."""

    def __init__(self, engine, cost, fake, log, name, seen):
        self.engine, self.cost, self.fake, self.log, self.name, self.seen = engine, cost, fake, log, name, seen

    def submit(self, ids, params, on_tokens=None):
        return self.engine.submit(ids, params, on_tokens)

    def step(self):
        self.log.append((self.name, *self.seen()))
        self.engine.step()
        self.fake.now += self.cost

    def cancel(self, rid):
        self.engine.cancel(rid)

    def has_work(self):
        return self.engine.has_work()


def test_step_clock_runs_only_during_its_steps(monkeypatch):
    fake = _FakeTime()
    monkeypatch.setattr(step_interleave, "time", fake)
    clock = StepClock()
    assert clock() == 0.0
    fake.now += 5                      # another engine's step: not this clock's time
    with clock.running():
        fake.now += 2
        assert clock() == 2.0          # read inside a step: the time so far
    fake.now += 7
    assert clock() == 2.0
    with clock.running():
        fake.now += 1.5
    assert clock() == 3.5
    with pytest.raises(RuntimeError, match="already running"), clock.running(), clock.running():
        pass


def test_the_engine_furthest_behind_steps_next_and_each_cell_is_timed_by_its_own_steps(ckpt, monkeypatch):
    """Two engines whose steps cost 1 and 3 (fake) seconds: the cheap one takes three steps to the other's one while
    both run, every request's timestamps are in its own engine's seconds, and the two policies' outputs are the
    same tokens (greedy, separate KV caches)."""
    from recguide_trt import LLM

    fake = _FakeTime()
    monkeypatch.setattr(step_interleave, "time", fake)
    llm = LLM(model=str(ckpt), max_num_seqs=1)
    clocks = [StepClock(), StepClock()]
    engines = [llm.new_engine(c, max_num_seqs=2, max_model_len=64) for c in clocks]
    assert engines[0].backend is not engines[1].backend and engines[0].backend is not llm.backend
    assert engines[0].config.max_num_seqs == 2 and engines[0].config.max_model_len == 64
    log: list[tuple] = []
    cells: list[Cell] = []

    def seen():   # both clocks, and whether both cells still run, as a step starts
        return clocks[0](), clocks[1](), len(cells) == 2 and not (cells[0].done or cells[1].done)

    targets = [_Costly(engines[0], 1.0, fake, log, "ar", seen), _Costly(engines[1], 3.0, fake, log, "spec", seen)]
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]

    def params(policy, block=None):
        return lambda n: SamplingParams(max_tokens=n, policy=policy, block_size=block, stop_at_eos=False)

    cells += [Cell(targets[0], prompts, params("ar"), 2, 4, 8, "ar"),
              Cell(targets[1], prompts, params("linearspec", 4), 2, 4, 8, "spec")]
    results = run_interleaved(cells, clocks)
    # While both ran, the engine whose clock read less stepped (AR on a tie), so the clocks stayed within one step
    # of each other and the 1 s engine took three steps to each of the 3 s engine's.
    both = [(name, a, b) for name, a, b, live in log if live]
    assert {name for name, *_ in both} == {"ar", "spec"}
    for name, a, b in both:
        assert (a <= b) if name == "ar" else (b < a), both
        assert abs(a - b) <= 3
    n_ar, n_spec = sum(n == "ar" for n, *_ in both), sum(n == "spec" for n, *_ in both)
    assert abs(n_ar - 3 * n_spec) <= 3, (n_ar, n_spec)
    for res, clock, target in zip(results, clocks, targets):
        steps = sum(name == target.name for name, *_ in log)
        assert clock() == pytest.approx(steps * target.cost)   # the clock holds its own steps only
        for r in res.requests:
            assert all(t <= clock() for t in r.metrics.token_times)
        tp = res.throughput
        assert tp["window_s"] <= clock() and tp["window_s"] == pytest.approx(round(tp["window_s"] / target.cost)
                                                                             * target.cost)
    out = {name: {res.prompt_index[r.id]: r.output_ids for r in res.requests}
           for name, res in zip(("ar", "spec"), results)}
    common = set(out["ar"]) & set(out["spec"])
    assert common and all(out["ar"][i] == out["spec"][i] for i in common)
    with pytest.raises(ValueError, match="clock of its own"):
        run_interleaved(cells[:1] * 2, [clocks[0], clocks[0]])
    with pytest.raises(ValueError, match="max_model_len"):
        llm.new_engine(max_model_len=0)


def test_sweep_step_runs_every_policy_on_its_own_engine(ckpt, monkeypatch, tmp_path):
    monkeypatch.setenv("RECGUIDE_CACHE", str(tmp_path / "cache"))
    from recguide_trt import LLM
    from recguide_trt.bench import sweep

    llm = LLM(model=str(ckpt), max_num_seqs=1)
    made = []
    real = llm.new_engine

    def spy(*a, **k):
        made.append(real(*a, **k))
        return made[-1]

    monkeypatch.setattr(llm, "new_engine", spy)
    calibrated = []
    real_calibrate = sweep.calibrate

    def calibrate(engine, *a):
        info = real_calibrate(engine, *a)
        calibrated.append((engine, engine.time_step))   # its steps timed: its clock ran
        return info

    monkeypatch.setattr(sweep, "calibrate", calibrate)
    specs = [sweep.PolicySpec("ar", "ar"), sweep.PolicySpec("linearspec-L2", "linearspec", 2),
             sweep.PolicySpec("recguide", "recguide")]
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12], [13, 14]]
    res = sweep.run_sweep(llm, prompts, specs, [1, 3], n_requests=3, max_tokens=5, ignore_eos=True,
                          progress=False, repeats=2, traces=True, interleave="step")
    assert len(made) == 3 and llm.engine.steps == 0          # the LLM's own engine ran nothing
    assert all(e.config.max_num_seqs == 3 and e.config.max_model_len == 3 + 8 for e in made)  # the calibration's 8 tokens
    assert len(calibrated) == 1 and calibrated[0][0] is made[2] and calibrated[0][1] > 0   # on RecGuide's engine
    tables = [e.policies["recguide"].cost for e in made]
    assert all(t is not None for t in tables)                # one measurement, given to every engine
    assert len({id(getattr(t, "table", t)) for t in tables}) == 1
    ar_engine = made[0]
    assert set(ar_engine.blocks_by_concurrency[3]) == {1}    # only AR's steps on AR's engine
    assert sum(made[2].policies["recguide"].mode_steps.values()) > 0 and \
        sum(made[0].policies["recguide"].mode_steps.values()) == 0
    for cell in res["cells"]:
        C = cell["C"]
        assert cell["metrics"]["requests"] == 2 * max(2 * C, 3) and len(cell["throughput"]["repeats"]) == 2
        assert cell["engine"]["concurrency_hist"] == {C: cell["engine"]["steps"]}
    assert {(t["policy"], t["C"]) for t in res["traces"]} == {(s.label, C) for s in specs for C in (1, 3)}


def test_interleave_step_through_the_console_script(ckpt, tmp_path):
    """`recguide bench --interleave step` as a user runs it."""
    out = tmp_path / "out"
    r = recguide_bench("--model", ckpt, "--workload", "random", "--concurrency", "1,2", "--policies",
                       "ar,linearspec,recguide", "--blocks", "2", "--requests", "2", "--max-tokens", "6", "--ignore-eos",
                       "--num-prompts", "4", "--interleave", "step", "--repeats", "2", "--no-progress", "--no-plots",
                       "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "paired per repeat" in r.stdout
    table = (out / "table.md").read_text()
    assert "Interleaved step by step (--interleave step)" in table
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["interleave"] == "step" and res["environment"]["max_num_seqs"] == 2
    assert {c["policy"] for c in res["cells"]} == {"ar", "linearspec-L2", "linearspec-L4", "recguide"}  # L4: the model default
    assert all(c["failed"] == 0 and len(c["throughput"]["repeats"]) == 2 for c in res["cells"])
    bad = recguide_bench("--model", ckpt, "--interleave", "step", "--openai", "http://127.0.0.1:9", "--out", out,
                         timeout=300)
    assert bad.returncode != 0 and "--interleave step runs in-process only" in bad.stderr
