"""overlap="streams": plans, executors (dependency order) and split-vs-fused equivalence."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from recguide_trt.backends.base import ForwardBatch, ForwardOutput
from recguide_trt.backends.torch_backend import TorchBackend
from recguide_trt.model import masks
from recguide_trt.runtime.streams import (
    FusedRow,
    Op,
    SequentialExecutor,
    StreamPlan,
    ThreadedExecutor,
    check_trace,
    merge_split_outputs,
    overlap_seconds,
    split_fused_batch,
    split_overlap_plan,
)

from ..conftest import random_model, tiny_config

MASK = 3  # tiny_config's mask_token_id
SLOTS, CAPACITY = 4, 64


# ------------------------------------------------------------------------------------------------
# helpers: batches built by hand, as Executor.pack lays them out
# ------------------------------------------------------------------------------------------------
def pack(rows, slots, past_lens, want=None) -> ForwardBatch:
    """rows: list of (tokens, positions, intra mask, gate)."""
    B, T = len(rows), max(len(r[0]) for r in rows)
    ids = np.zeros((B, T), np.int64)
    pos = np.zeros((B, T), np.int64)
    intra = np.zeros((B, T, T), bool)
    intra[:, np.arange(T), np.arange(T)] = True
    gate = np.zeros((B, T), np.float32)
    for b, (tok, p, m, g) in enumerate(rows):
        n = len(tok)
        ids[b, :n], pos[b, :n], pos[b, n:] = tok, p, p[-1]
        intra[b, :n, :n] = m
        gate[b, :n] = g
    return ForwardBatch(slots=np.asarray(slots, np.int64), past_lens=np.asarray(past_lens, np.int64),
                        input_ids=ids, position_ids=pos, intra_mask=intra, draft_gate=gate,
                        want_logits=np.asarray(want if want is not None else [False] * B, bool))


def causal_row(tokens, start):
    n = len(tokens)
    return list(tokens), start + np.arange(n), masks.causal(n), np.zeros(n, np.float32)


def fused_row(verify, start, shared, first, block):
    n = len(verify)
    tokens = list(verify) + [first] + [MASK] * (block - 1)
    pos = np.concatenate([start + np.arange(n), start + shared + np.arange(block)])
    gate = np.concatenate([np.zeros(n, np.float32), np.ones(block, np.float32)])
    return tokens, pos, masks.fused_rows(n, shared, block), gate


class DelayBackend:
    """Records forwards per thread; sleeps per op via the batch's first token id."""

    name = "delay"

    def __init__(self, delays: dict[int, float]):
        self.delays = delays
        self.calls: list[int] = []
        self.lock = threading.Lock()

    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        key = int(batch.input_ids[0, 0])
        time.sleep(self.delays.get(key, 0.0))
        with self.lock:
            self.calls.append(key)
        B, T = batch.input_ids.shape
        return ForwardOutput(argmax=batch.input_ids.copy(), top_ids=np.zeros((B, T, 3), np.int64),
                             top_probs=np.zeros((B, T, 2), np.float32))


def tagged(tag: int) -> ForwardBatch:
    return pack([causal_row([tag, 5], 0)], [0], [0])


# ------------------------------------------------------------------------------------------------
# plans
# ------------------------------------------------------------------------------------------------
def test_plan_validation():
    b = tagged(1)
    with pytest.raises(ValueError, match="unknown stream"):
        StreamPlan([Op("a", "side", b)])
    with pytest.raises(ValueError, match="duplicate"):
        StreamPlan([Op("a", "verify", b), Op("a", "draft", b)])
    with pytest.raises(ValueError, match="not an earlier op"):
        StreamPlan([Op("a", "verify", b, depends_on=("b",)), Op("b", "draft", b)])
    plan = StreamPlan([Op("a", "draft", b), Op("b", "verify", b, depends_on=("a",))])
    assert plan.streams == ["draft", "verify"] and [o.name for o in plan.topological()] == ["a", "b"]


def test_split_overlap_plan_forces_no_kv_write_and_checks_prefix():
    v, p = tagged(1), tagged(2)
    plan = split_overlap_plan(v, p)
    assert [(o.name, o.stream, o.depends_on) for o in plan.ops] == [("verify", "verify", ()),
                                                                    ("prospective", "draft", ())]
    assert plan.op("verify").batch.write_kv and not plan.op("prospective").batch.write_kv
    assert p.write_kv  # the caller's batch is not mutated
    bad = pack([causal_row([2, 5], 3)], [0], [3])
    with pytest.raises(ValueError, match="past length"):
        split_overlap_plan(v, bad)
    assert [o.name for o in split_overlap_plan(v, None).ops] == ["verify"]


# ------------------------------------------------------------------------------------------------
# (a) dependency order under threads with artificial delays
# ------------------------------------------------------------------------------------------------
def test_threaded_executor_respects_dependencies():
    # A (draft, slow) -> B (verify); C (verify, after B in FIFO); D (draft, depends on C).
    delays = {1: 0.15, 2: 0.01, 3: 0.05, 4: 0.0, 5: 0.0}
    backend = DelayBackend(delays)
    plan = StreamPlan([
        Op("A", "draft", tagged(1)),
        Op("B", "verify", tagged(2), depends_on=("A",)),
        Op("C", "verify", tagged(3)),
        Op("D", "draft", tagged(4), depends_on=("C",)),
        Op("E", "draft", tagged(5)),
    ])
    ex = ThreadedExecutor()
    out = ex.run(plan, backend)
    assert set(out) == {"A", "B", "C", "D", "E"}
    assert int(out["D"].argmax[0, 0]) == 4
    check_trace(plan, ex.trace)
    assert backend.calls.index(1) < backend.calls.index(2) < backend.calls.index(3) < backend.calls.index(4)
    # a check_trace failure is detected: swap A's and B's order in a fake trace
    fake = [e.__class__(e.op, e.stream, e.kind, -e.t) for e in ex.trace]
    with pytest.raises(AssertionError):
        check_trace(plan, fake)


def test_threaded_executor_overlaps_independent_streams():
    backend = DelayBackend({1: 0.2, 2: 0.2})
    plan = split_overlap_plan(tagged(1), tagged(2))
    ex = ThreadedExecutor()
    t0 = time.perf_counter()
    ex.run(plan, backend)
    wall = time.perf_counter() - t0
    check_trace(plan, ex.trace)
    assert overlap_seconds(ex.trace, "verify", "prospective") > 0.1
    assert wall < 0.38


def test_threaded_executor_propagates_errors():
    class Failing(DelayBackend):
        def forward(self, batch):
            if int(batch.input_ids[0, 0]) == 1:
                raise RuntimeError("boom")
            return super().forward(batch)

    backend = Failing({})
    plan = StreamPlan([Op("A", "draft", tagged(1)), Op("B", "verify", tagged(2), depends_on=("A",)),
                       Op("C", "verify", tagged(3))])
    with pytest.raises(RuntimeError, match="boom"):
        ThreadedExecutor().run(plan, backend)
    assert 2 not in backend.calls and 3 in backend.calls


# ------------------------------------------------------------------------------------------------
# (b)/(c) split plan on the torch backend == one fused forward; KV as after a plain verify
# ------------------------------------------------------------------------------------------------
def _setup(seed: int = 0):
    cfg = tiny_config()
    model = random_model(cfg, seed=seed)
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(4, cfg.vocab_size, size=n).tolist() for n in (7, 5, 9)]
    return cfg, model, prompts


def _zero_caches(be: TorchBackend) -> TorchBackend:
    # TorchBackend's caches are torch.empty: a row whose past is shorter than the batch's longest
    # reads uninitialised (masked) positions, and a NaN there poisons the row (0 * NaN in P @ V).
    # Zero them so these tests compare the stream logic, not allocator garbage (bug reported).
    for c in be.k_cache + be.v_cache:
        c.zero_()
    return be


def _prefilled(model, prompts) -> TorchBackend:
    be = _zero_caches(TorchBackend(model, SLOTS, CAPACITY))
    for s, p in enumerate(prompts):
        be.forward(pack([causal_row(p[:-1], 0)], [s], [0]))
    return be


def _step(cfg, prompts):
    """A step like Executor.pack builds it: row 0 fused (correction), row 1 plain verify,
    row 2 fused (full-accept continuation). Every request's seed is its last prompt token."""
    rng = np.random.default_rng(1)
    L = cfg.block_size
    past = [len(p) - 1 for p in prompts]
    verifies = [[p[-1]] + rng.integers(4, cfg.vocab_size, size=L - 1).tolist() for p in prompts]
    rows = [fused_row(verifies[0], past[0], 2, 17, L), causal_row(verifies[1], past[1]),
            fused_row(verifies[2], past[2], L, MASK, L)]
    fused = {0: FusedRow(L, 2, L), 2: FusedRow(L, L, L)}
    row_lens = [len(r[0]) for r in rows]
    return pack(rows, [0, 1, 2], past, want=[True, False, True]), row_lens, fused


@pytest.mark.parametrize("executor", ["sequential", "threaded"])
def test_split_plan_matches_fused_forward(executor):
    cfg, model, prompts = _setup()
    batch, row_lens, fused = _step(cfg, prompts)
    ref_be = _prefilled(model, prompts)
    ref = ref_be.forward(batch)                       # ONE fused forward

    split = split_fused_batch(batch, row_lens, fused)
    assert split.verify.input_ids.shape == (3, cfg.block_size)
    assert not split.prospective.write_kv
    be = _prefilled(model, prompts)
    plan = split_overlap_plan(split.verify, split.prospective)
    ex = SequentialExecutor() if executor == "sequential" else ThreadedExecutor()
    outs = ex.run(plan, be)
    check_trace(plan, ex.trace)
    merged = merge_split_outputs(split, outs)

    for b, n in enumerate(row_lens):
        np.testing.assert_array_equal(merged.argmax[b, :n], ref.argmax[b, :n])
        np.testing.assert_array_equal(merged.top_ids[b, :n], ref.top_ids[b, :n])
        np.testing.assert_allclose(merged.top_probs[b, :n], ref.top_probs[b, :n], rtol=1e-5, atol=1e-6)
        if ref.logits is not None and b in (0, 2):
            np.testing.assert_allclose(merged.logits[b, :n], ref.logits[b, :n], rtol=1e-4, atol=1e-5)

    # KV after the split plan == KV after a plain verify forward (the prospective wrote nothing).
    plain = _prefilled(model, prompts)
    plain.forward(split.verify)
    past = batch.past_lens
    for kc, pc in zip(be.k_cache + be.v_cache, plain.k_cache + plain.v_cache):
        for s in range(3):
            n = int(past[s]) + cfg.block_size
            torch.testing.assert_close(kc[s, :, :n], pc[s, :, :n], rtol=0, atol=0)


def test_sequential_and_threaded_identical():
    cfg, model, prompts = _setup(seed=3)
    batch, row_lens, fused = _step(cfg, prompts)
    split = split_fused_batch(batch, row_lens, fused)
    plan = split_overlap_plan(split.verify, split.prospective)
    results = []
    for ex in (SequentialExecutor(), ThreadedExecutor()):
        be = _prefilled(model, prompts)
        outs = ex.run(plan, be)
        results.append((outs, be))
    (a, be_a), (b, be_b) = results
    for name in ("verify", "prospective"):
        np.testing.assert_array_equal(a[name].argmax, b[name].argmax)
        np.testing.assert_array_equal(a[name].top_ids, b[name].top_ids)
        np.testing.assert_array_equal(a[name].top_probs, b[name].top_probs)
    for x, y in zip(be_a.k_cache + be_a.v_cache, be_b.k_cache + be_b.v_cache):
        for s in range(3):
            n = int(batch.past_lens[s]) + cfg.block_size
            torch.testing.assert_close(x[s, :, :n], y[s, :, :n], rtol=0, atol=0)


def test_split_rejects_bad_layouts():
    cfg, _, prompts = _setup()
    batch, row_lens, fused = _step(cfg, prompts)
    with pytest.raises(ValueError, match="row length"):
        split_fused_batch(batch, row_lens, {0: FusedRow(cfg.block_size, 2, cfg.block_size - 1)})
    with pytest.raises(ValueError, match="entries"):
        split_fused_batch(batch, row_lens[:2], fused)
    split = split_fused_batch(batch, row_lens, {})
    assert split.prospective is None


# ------------------------------------------------------------------------------------------------
# GPU: torch CUDA streams
# ------------------------------------------------------------------------------------------------
def _cuda_ok() -> bool:
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_ok(), reason="no CUDA GPU visible to torch")
def test_torch_cuda_stream_executor_matches_sequential():
    from recguide_trt.runtime.streams import TorchCudaStreamExecutor

    cfg, model, prompts = _setup()
    batch, row_lens, fused = _step(cfg, prompts)
    split = split_fused_batch(batch, row_lens, fused)
    plan = split_overlap_plan(split.verify, split.prospective)
    cpu_outs = SequentialExecutor().run(plan, _prefilled(model, prompts))
    gpu_model = model.to("cuda")
    be = _zero_caches(TorchBackend(gpu_model, SLOTS, CAPACITY, device="cuda"))
    for s, p in enumerate(prompts):
        be.forward(pack([causal_row(p[:-1], 0)], [s], [0]))
    ex = TorchCudaStreamExecutor("cuda")
    outs = ex.run(plan, be)
    check_trace(plan, ex.trace)
    for name in ("verify", "prospective"):
        np.testing.assert_array_equal(outs[name].argmax, cpu_outs[name].argmax)
        np.testing.assert_allclose(outs[name].top_probs, cpu_outs[name].top_probs, rtol=1e-4, atol=1e-5)
    # dependent plan: verify waits for the draft on another stream
    dep = StreamPlan([Op("draft", "draft", split.prospective),
                      Op("verify", "verify", split.verify, depends_on=("draft",))])
    ex.run(dep, be)
    check_trace(dep, ex.trace)
