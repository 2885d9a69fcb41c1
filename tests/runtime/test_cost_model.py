"""The start-up cost table: probe steps, interpolation, cache keys."""

from __future__ import annotations

import math

import numpy as np
import pytest

from recguide_trt.runtime.cost_model import (
    PROBE_VERSION,
    CostTable,
    cached_cost_table,
    measure_cost_table,
    monotone_envelope,
    probe_draft_gate,
)


class RecordingBackend:
    """Counts the work of each forward; records the probe batches."""

    max_slots, slot_capacity, vocab_size = 4, 64, 50

    def __init__(self):
        self.batches = []

    def forward(self, batch):
        self.batches.append(batch)


def test_probe_gates_half_the_tokens_of_speculative_steps():
    assert not probe_draft_gate(4, 1).any()
    for b, t in ((1, 8), (4, 2), (3, 4)):
        gate = probe_draft_gate(b, t)
        assert gate.shape == (b, t) and gate.sum() == b * t - (b * t) // 2


def test_measure_probes_gated_and_plain_steps_and_fits_the_backend():
    be = RecordingBackend()
    table = measure_cost_table(be, batches=(1, 2, 8), tokens=(1, 4, 64), past_len=10, reps=1)
    assert table.batches == [1, 2] and table.tokens == [1, 4]   # 8 slots / 64 tokens do not fit
    gated = {}
    for batch in be.batches:
        b, t = batch.input_ids.shape
        on = bool(batch.draft_gate.any())
        assert np.array_equal(batch.draft_gate, probe_draft_gate(b, t) if on else np.zeros((b, t)))
        assert (batch.position_ids[:, 0] == 10).all()
        gated.setdefault((b, t), set()).add(on)
    # A 1-token step has no draft token to gate; every wider cell is timed both ways.
    assert gated == {(1, 1): {False}, (2, 1): {False}, (1, 4): {False, True}, (2, 4): {False, True}}
    assert np.asarray(table.seconds).shape == np.asarray(table.plain).shape == (2, 2)
    assert (np.asarray(table.plain) <= np.asarray(table.seconds)).all()


class TimedBackend(RecordingBackend):
    """1 ms + 1 ms per token, plus 3 ms with a draft token in the step; ``noisy``: plain 4-token
    probes take 8 ms more (more than the gated ones). The time is a fake clock's, which each forward
    advances (``clock``), so a loaded machine's late wake-ups cannot blur the 3 ms (a real sleep
    overslept a plain probe by 2.9 ms in a CI run)."""

    def __init__(self, noisy: bool = False):
        super().__init__()
        self.noisy, self.now = noisy, 0.0

    def clock(self) -> float:
        return self.now

    def forward(self, batch):
        t = batch.input_ids.shape[1]
        gated = bool(batch.draft_gate.any())
        self.now += 0.001 * (1 + t) + 0.003 * gated + 0.008 * (self.noisy and t == 4 and not gated)


def test_adapter_prices_apart_from_plain_steps(monkeypatch):
    import types

    from recguide_trt.runtime import cost_model

    def measured(be):
        monkeypatch.setattr(cost_model, "time", types.SimpleNamespace(perf_counter=be.clock))
        return measure_cost_table(be, batches=(1,), tokens=(1, 4), past_len=10, reps=1)

    table = measured(TimedBackend())
    assert table.step_time(1, 4, adapter=False) == pytest.approx(0.005)
    assert table.step_time(1, 4, adapter=True) == pytest.approx(0.008)
    assert table.step_time(1, 1, adapter=False) == table.step_time(1, 1, adapter=True)
    noisy = measured(TimedBackend(noisy=True))
    assert noisy.seconds[0][1] == noisy.plain[0][1]     # the adapter never prices below no adapter
    two = CostTable([1], [1, 4], [[1.0, 3.0]], plain=[[1.0, 2.0]])
    assert two.step_time(1, 4) == 3.0 and two.step_time(1, 4, adapter=False) == 2.0
    one = CostTable([1], [1, 4], [[1.0, 3.0]])          # no plain grid: one price for both
    assert one.step_time(1, 4, adapter=False) == one.step_time(1, 4) == 3.0
    assert CostTable(**two.to_dict()).plain == [[1.0, 2.0]]


class BurstBackend(RecordingBackend):
    """1 ms + 1 ms per token, and 20 ms more for each of the first ``burst`` forwards (another
    process holding the CPU for a while, as on a shared machine)."""

    def __init__(self, burst: int):
        super().__init__()
        self.burst = burst

    def forward(self, batch):
        import time

        super().forward(batch)
        time.sleep(0.001 * (1 + batch.input_ids.shape[1]) + 0.020 * (len(self.batches) <= self.burst))


def test_a_burst_of_load_spoils_no_cell():
    """Probed cell after cell, a burst as long as one cell's probes prices that cell (here the AR
    step) 20 ms high; in passes over the grid every cell keeps a timing from after the burst."""
    be = BurstBackend(burst=5)
    table = measure_cost_table(be, batches=(1,), tokens=(1, 4), past_len=10, reps=2)
    assert len(be.batches) == 3 * (1 + 2)                  # a warm-up and 2 timings per cell, no more
    assert table.step_time(1, 1, adapter=False) < 0.012, table.plain
    assert table.step_time(1, 4, adapter=False) < 0.015, table.plain
    assert table.step_time(1, 4, adapter=True) < 0.015, table.seconds
    cells = measure_cost_table(BurstBackend(burst=5), batches=(1,), tokens=(1, 4), past_len=10, reps=2,
                               order="cells")
    assert cells.step_time(1, 1, adapter=False) > 0.020, cells.plain   # the old order: the AR cell spoilt
    for bad in ({"reps": 0}, {"order": "random"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            measure_cost_table(be, batches=(1,), tokens=(1,), **bad)


def test_monotone_envelope_removes_probe_noise_only():
    noisy = [[3.0, 4.2, 5.1, 4.8], [2.9, 4.9, 4.9, 5.6], [6.0, 9.5, 12.9, 19.5]]
    env = monotone_envelope(noisy)
    assert env == [[3.0, 4.2, 5.1, 5.1], [3.0, 4.9, 5.1, 5.6], [6.0, 9.5, 12.9, 19.5]]
    assert monotone_envelope(env) == env                        # already monotone: unchanged
    assert all(a <= b for row in env for a, b in zip(row, row[1:]))


def test_interpolation_between_and_past_the_grid():
    table = CostTable([1, 4], [1, 4], [[1.0, 2.0], [3.0, 6.0]])
    assert table.step_time(1, 1) == pytest.approx(1.0)
    assert table.step_time(2, 2) == pytest.approx(3.0)          # halfway in log space on both axes
    assert table.step_time(8, 4) == pytest.approx(12.0)         # linear in work past the grid


def test_cache_key_includes_the_probe_version(tmp_path):
    be = RecordingBackend()
    t1 = cached_cost_table(be, {"model": "x"}, cache_dir=tmp_path, batches=(1,), tokens=(1,), reps=1)
    assert t1.meta["probe_version"] == PROBE_VERSION
    n = len(be.batches)
    cached_cost_table(be, {"model": "x"}, cache_dir=tmp_path, batches=(1,), tokens=(1,), reps=1)
    assert len(be.batches) == n   # second call read the file


def test_refit_rescales_measured_cells_and_shifts_the_rest_alike():
    from recguide_trt.runtime.cost_refit import UPDATE_EVERY, RefittedCostTable

    table = CostTable([1, 16, 64], [1, 4], [[1.0, 1.2], [2.0, 3.0], [4.0, 8.0]])
    refit = RefittedCostTable(table, alpha=0.1, min_samples=4)
    for _ in range(3):
        refit.observe(16, 4, 3.6)
    assert refit.step_time(16, 4) == pytest.approx(3.0)        # too few samples: the table's value
    assert refit.step_time(16, 1) == pytest.approx(2.0)
    for _ in range(50):
        refit.observe(16, 4, 3.6)
    assert refit.step_time(16, 4) == pytest.approx(3.6, rel=1e-6)
    # Not measured: the same row's correction (x1.2), so 1 vs 4 tokens at C=16 compare as in the table.
    assert refit.step_time(16, 1) == pytest.approx(2.4, rel=1e-6)
    assert refit.step_time(64, 1) == pytest.approx(4.8, rel=1e-6)  # a row with no measurement: all cells'
    version = refit.version
    for _ in range(4):
        refit.observe(64, 1, 4.0)                              # measured as tabled: row 64 on its own now
    assert refit.version > version                             # a cell becoming measured updates at once
    assert refit.step_time(64, 4) == pytest.approx(8.0, rel=1e-6)
    assert refit.step_time(1, 1) == pytest.approx(math.exp((53 * math.log(1.2) + 4 * 0.0) / 57), rel=1e-6)
    # Later samples update the averages every UPDATE_EVERY observations, not every step.
    version = refit.version
    for _ in range(UPDATE_EVERY - 1):
        refit.observe(64, 1, 4.0)
    assert refit.version == version
    refit.observe(64, 1, 4.0)
    assert refit.version == version + 1
    assert refit.step_time(1, 1) == pytest.approx(math.exp(53 * math.log(1.2) / (57 + UPDATE_EVERY)), rel=1e-6)
    refit.observe(16, 500, 99.0)                               # a prefill-sized step is ignored
    assert refit.samples.sum() == 57 + UPDATE_EVERY
    with pytest.raises(ValueError, match="alpha"):
        RefittedCostTable(table, alpha=0.0)


def test_refit_keeps_adapter_and_plain_steps_apart():
    from recguide_trt.runtime.cost_refit import RefittedCostTable

    table = CostTable([1, 4], [1, 8], [[1.0, 3.0], [2.0, 6.0]], plain=[[1.0, 2.0], [2.0, 4.0]])
    refit = RefittedCostTable(table, alpha=0.1, min_samples=4)
    for _ in range(20):
        refit.observe(1, 8, 3.3, adapter=True)                # drafts run 10 % over the table
        refit.observe(1, 8, 1.8, adapter=False)               # verifies 10 % under it
    assert refit.step_time(1, 8) == pytest.approx(3.3, rel=1e-6)
    assert refit.step_time(1, 8, adapter=False) == pytest.approx(1.8, rel=1e-6)
    assert refit.samples[0].sum() == refit.samples[1].sum() == 20
    # An unmeasured cell of the same batch size borrows both kinds' average (x 0.995).
    assert refit.step_time(1, 1, adapter=False) == pytest.approx(math.sqrt(1.1 * 0.9), rel=1e-6)


def _refit_ab(alpha=0.02):
    from recguide_trt.runtime.cost_refit import RefittedCostTable

    table = CostTable([1], [1, 8], [[1.0, 2.0]], plain=[[1.0, 1.5]])
    refit = RefittedCostTable(table, alpha=alpha, min_samples=8)
    A, B = (1, 8, False), (1, 8, True)      # a verify and a draft step of 8 tokens
    for _ in range(100):                    # both as tabled
        refit.observe(*A[:2], 1.5, adapter=False)
        refit.observe(*B[:2], 2.0, adapter=True)
    return refit


def test_refit_burst_of_slow_steps_on_one_cell_does_not_overprice_it_afterwards():
    """The machine is busy while only verifies run (1.4x), then idle while only drafts run: a
    per-cell average left the verify cell at 1.4x for good (the policy no longer ran it)."""
    refit = _refit_ab()
    for _ in range(200):
        refit.observe(1, 8, 1.5 * 1.4, adapter=False)
    # During the burst the draft cell, never run, is priced up alike: the choice between them stands.
    refit._update_factors()
    assert refit.correction(1, 8, True) > 1.25
    assert refit.correction(1, 8, False) / refit.correction(1, 8, True) < 1.1
    for _ in range(200):
        refit.observe(1, 8, 2.0, adapter=True)
    refit._update_factors()
    assert refit.correction(1, 8, True) == pytest.approx(1.0, abs=0.01)
    assert refit.correction(1, 8, False) / refit.correction(1, 8, True) < 1.1   # a per-cell EMA: 1.4


def test_refit_still_learns_what_one_shape_really_costs():
    refit = _refit_ab()
    for _ in range(400):                    # verifies now really cost 1.4x, drafts as tabled, interleaved
        refit.observe(1, 8, 1.5 * 1.4, adapter=False)
        refit.observe(1, 8, 2.0, adapter=True)
    refit._update_factors()
    assert refit.correction(1, 8, False) / refit.correction(1, 8, True) == pytest.approx(1.4, rel=0.02)
    assert refit.step_time(1, 8, adapter=True) == pytest.approx(2.0, rel=0.03)


def test_engine_refits_its_measured_table_from_recguide_steps(random_ckpt, tmp_path, monkeypatch):
    from recguide_trt import LLM, EngineConfig, SamplingParams
    from recguide_trt.runtime.cost_refit import RefittedCostTable

    monkeypatch.setenv("RECGUIDE_CACHE", str(tmp_path))
    llm = LLM(random_ckpt, engine_config=EngineConfig(max_num_seqs=2, max_model_len=256))
    llm.generate([[5, 6, 7]] * 2, SamplingParams(max_tokens=24, policy="recguide"))
    cost = llm.engine.policies["recguide"].cost
    assert isinstance(cost, RefittedCostTable) and cost.samples.sum() > 0
    # Draft steps (adapter on) and verify-only steps land in their own cells.
    assert cost.samples[0].sum() > 0 and cost.samples[1].sum() > 0
    assert cost.table.plain is not None
    seen = cost.samples.sum()
    llm.generate([[5, 6, 7]] * 2, SamplingParams(max_tokens=24, policy="ar"))
    assert cost.samples.sum() == seen   # other policies' steps do not feed it
    fixed = CostTable([1], [1], [[1.0]])
    llm = LLM(random_ckpt, engine_config=EngineConfig(max_num_seqs=2, max_model_len=256, cost_table=fixed))
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=8, policy="recguide"))
    assert llm.engine.policies["recguide"].cost is fixed


def test_peer_controllers_get_the_start_up_table_itself(random_ckpt, tmp_path, monkeypatch):
    """vLLM's Adaptive K profiles its costs once at start-up: the peer prices steps with the same
    start-up measurement RecGuide starts from, not RecGuide's online refit."""
    from recguide_trt import LLM, EngineConfig, SamplingParams
    from recguide_trt.runtime.cost_refit import RefittedCostTable

    monkeypatch.setenv("RECGUIDE_CACHE", str(tmp_path))
    llm = LLM(random_ckpt, backend="torch", engine_config=EngineConfig(max_num_seqs=2, max_model_len=256))
    peer = llm.engine.policies["vllm-adaptive-k"]
    assert peer.cost is None
    llm.generate([[5, 6, 7]] * 2, SamplingParams(max_tokens=16, policy="vllm-adaptive-k"))   # a peer alone measures it
    rg = llm.engine.policies["recguide"].cost
    assert isinstance(rg, RefittedCostTable) and peer.cost is rg.table
    assert not isinstance(peer.cost, RefittedCostTable)
    fixed = CostTable([1], [1], [[1.0]])
    llm = LLM(random_ckpt, backend="torch", engine_config=EngineConfig(max_num_seqs=2, max_model_len=256,
                                                                       cost_table=fixed))
    assert llm.engine.policies["vllm-adaptive-k"].cost is fixed


def test_engine_config_names_a_bad_controller_config():
    from recguide_trt import EngineConfig

    for field in ("trtllm_schedule", "sglang_adaptive", "sglang_autospec", "vllm_adaptive_k"):
        with pytest.raises(ValueError, match=f"^{field} must be a "):
            EngineConfig(**{field: {"draft_len_schedule": {4: 3}}}).validate()


@pytest.mark.parametrize("packs", [False, True])
def test_refit_learns_a_packed_step_at_its_mean_row_length(packs):
    """A backend that packs its rows pays for their real tokens: a decode step with one 4-token row
    and three 1-token rows is learned at their mean length there, at the longest row's where rows
    are padded."""
    import numpy as np

    from recguide_trt.backends.base import ForwardBatch
    from recguide_trt.backends.native_backend import NativeBackend
    from tests.runtime.helpers import fake_engine

    engine = fake_engine(max_num_seqs=4)
    engine.backend.packs_rows = packs
    lens = np.array([4, 1, 1, 1])
    batch = ForwardBatch(slots=np.arange(4), past_lens=np.full(4, 10), input_ids=np.ones((4, 4), np.int64),
                         position_ids=np.tile(10 + np.arange(4), (4, 1)), intra_mask=np.ones((4, 4, 4), bool),
                         draft_gate=np.zeros((4, 4), np.float32), want_logits=np.zeros(4, bool), row_lens=lens)
    assert engine._priced_width(batch) == (1.75 if packs else 4.0)
    assert NativeBackend.packs_rows is True


def test_refit_memo_of_fractional_widths_stays_bounded(monkeypatch):
    from recguide_trt.runtime import cost_refit

    monkeypatch.setattr(cost_refit, "MAX_MEMO", 64)
    refit = cost_refit.RefittedCostTable(CostTable([1, 4, 16, 64], [1, 2, 4, 8], [[1.0] * 4] * 4))
    for total in range(64, 64 * 8 + 1):  # 449 distinct mean widths of 64 rows
        refit.observe(64, total / 64, 1.0)
    assert 0 < len(refit._cells) <= 64
    assert refit.measured(64, 8.0) and refit.correction(64, 7.99) == refit.correction(64, 8.0)


def test_many_row_cells_off_the_powers_of_two_are_interpolated_not_probed(monkeypatch):
    """Above FINE_TOKENS_MAX_BATCH rows only powers of two are probed (a step there is nearly linear in its tokens);
    the grid's other token counts are filled in log(tokens) between them. Few-row cells are all probed."""
    import types

    from recguide_trt.runtime import cost_model

    class Recorded(TimedBackend):
        max_slots = 16

        def forward(self, batch):
            self.batches.append(batch)
            super().forward(batch)

    be = Recorded()
    monkeypatch.setattr(cost_model, "time", types.SimpleNamespace(perf_counter=be.clock))
    table = measure_cost_table(be, batches=(1, 8, 16), tokens=(1, 2, 3, 4, 6, 8), past_len=10, reps=1)
    probed = {batch.input_ids.shape for batch in be.batches}
    assert {(8, 3), (8, 6), (1, 6)} <= probed and not {(16, 3), (16, 6)} & probed and (16, 4) in probed
    row = table.plain[table.batches.index(16)]
    w = np.log(6 / 4) / np.log(8 / 4)
    assert row[table.tokens.index(6)] == pytest.approx(row[table.tokens.index(4)] * (1 - w) + row[table.tokens.index(8)] * w)
    gated = table.seconds[table.batches.index(16)]
    assert gated[table.tokens.index(3)] > row[table.tokens.index(3)]  # the gated twin interpolated from gated cells
    assert cost_model._power_of_two_neighbours(6, (1, 2, 4, 6, 8)) == (4, 8)
    assert cost_model._power_of_two_neighbours(24, (1, 2, 4, 8, 16, 24)) is None  # nothing above: probed
