"""Stream orchestration for ``overlap="streams"`` (DESIGN.md §3.1), as plain data plus executors.

The fused realisation of verification-overlapped drafting packs a verify row and a prospective
draft row into one forward. The stream realisation runs them as two forwards, concurrently:

* ``verify`` stream: the verify forward of block i (writes K/V of the new tokens);
* ``draft`` stream: the prospective draft of block i+1 (``write_kv=False``), which reads the same
  committed prefix and recomputes the verify tokens it assumes accepted (causally) in its own row.

Both depend only on the previous step's commit and are joined before acceptance. A step is a
:class:`StreamPlan` (ops in submission order, each on a named stream, with dependencies by name);
an executor runs it on a backend and returns ``{op name: ForwardOutput}``:

* :class:`SequentialExecutor` - one thread, submission (= topological) order. CPU reference.
* :class:`ThreadedExecutor` - one worker thread per stream, dependencies as ``threading.Event``.
* :class:`TorchCudaStreamExecutor` - ``torch.cuda.Stream`` per stream name, ``torch.cuda.Event``
  per dependency, ``backend.launch(batch, stream)`` then ``backend.collect`` (TorchBackend).
* :class:`CudaPythonStreamExecutor` - the same with cuda-python streams/events (TensorRTBackend).

Every executor records a :class:`TraceEvent` list (``executor.trace``) of op starts/ends, so tests
and benchmarks can check that the dependency order was respected. The GPU executors record
device-side times from CUDA events.

:func:`split_fused_batch` turns a packed fused batch (``Executor.pack`` with FUSED rows) into a
verify batch and a prospective batch, :func:`split_overlap_plan` wraps them into the two-stream
plan, and :func:`merge_split_outputs` reassembles the outputs in the fused batch's layout, so that
``Executor.decide`` interprets them unchanged.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends.base import ForwardBatch, ForwardOutput

VERIFY_STREAM = "verify"
DRAFT_STREAM = "draft"
STREAM_NAMES = (VERIFY_STREAM, DRAFT_STREAM)


# ------------------------------------------------------------------------------------------------
# Plans
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Op:
    """One forward of a plan."""

    name: str
    stream: str
    """``"verify"`` or ``"draft"``."""
    batch: ForwardBatch
    depends_on: tuple[str, ...] = ()
    """Names of ops (earlier in the plan) that must finish before this one starts. Ops on the
    same stream also run in submission order."""


@dataclass
class StreamPlan:
    """Ops in submission order; submission order must be a topological order of the dependencies."""

    ops: list[Op]

    def __post_init__(self) -> None:
        self.ops = list(self.ops)
        self.validate()

    def validate(self) -> None:
        seen: set[str] = set()
        for op in self.ops:
            if op.stream not in STREAM_NAMES:
                raise ValueError(f"op {op.name!r}: unknown stream {op.stream!r} (use {' or '.join(STREAM_NAMES)})")
            if op.name in seen:
                raise ValueError(f"duplicate op name {op.name!r}")
            for dep in op.depends_on:
                if dep not in seen:
                    raise ValueError(f"op {op.name!r} depends on {dep!r}, which is not an earlier op of the plan")
            seen.add(op.name)

    @property
    def streams(self) -> list[str]:
        """Stream names used, in order of first use."""
        out: list[str] = []
        for op in self.ops:
            if op.stream not in out:
                out.append(op.stream)
        return out

    def op(self, name: str) -> Op:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(name)

    def topological(self) -> list[Op]:
        """A valid execution order: submission order (checked by :meth:`validate`)."""
        return list(self.ops)


@dataclass(frozen=True)
class TraceEvent:
    op: str
    stream: str
    kind: str
    """``"start"`` or ``"end"``."""
    t: float
    """Seconds: host ``perf_counter`` (CPU executors) or device time since the plan's first event."""


def check_trace(plan: StreamPlan, trace: list[TraceEvent]) -> None:
    """Raise AssertionError unless every op started after its dependencies (and stream predecessors) ended."""
    start = {e.op: e.t for e in trace if e.kind == "start"}
    end = {e.op: e.t for e in trace if e.kind == "end"}
    last_on_stream: dict[str, str] = {}
    for op in plan.ops:
        if op.name not in start or op.name not in end:
            raise AssertionError(f"op {op.name!r} missing from the trace")
        if end[op.name] < start[op.name]:
            raise AssertionError(f"op {op.name!r} ended before it started")
        before = list(op.depends_on)
        if op.stream in last_on_stream:
            before.append(last_on_stream[op.stream])
        for dep in before:
            if start[op.name] < end[dep]:
                raise AssertionError(f"op {op.name!r} started at {start[op.name]:.6f}, before {dep!r} ended at "
                                     f"{end[dep]:.6f}")
        last_on_stream[op.stream] = op.name


def overlap_seconds(trace: list[TraceEvent], a: str, b: str) -> float:
    """How long ops ``a`` and ``b`` ran at the same time according to the trace."""
    span = {}
    for e in trace:
        span.setdefault(e.op, {})[e.kind] = e.t
    return max(0.0, min(span[a]["end"], span[b]["end"]) - max(span[a]["start"], span[b]["start"]))


# ------------------------------------------------------------------------------------------------
# Building the overlap plan from a fused batch
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FusedRow:
    """Layout of one fused row of a packed batch (see ``Executor.row_tokens`` for Kind.FUSED)."""

    verify_len: int
    """``n``: tokens of the verify part (seed + drafts)."""
    shared: int
    """Verify tokens the prospective block sees (``Prospective.shared``)."""
    block: int
    """Tokens of the prospective block (``Prospective.block``)."""


@dataclass
class SplitBatches:
    """The two forwards of one ``overlap="streams"`` step and how to map them back."""

    verify: ForwardBatch
    prospective: ForwardBatch | None
    fused_shape: tuple[int, int]
    """``(B, T)`` of the fused batch the outputs are merged into."""
    prospective_rows: list[int] = field(default_factory=list)
    """Fused-batch row of each prospective-batch row."""
    layouts: list[FusedRow] = field(default_factory=list)
    """Layout of each prospective-batch row."""


def _pad_row_mask(T: int) -> np.ndarray:
    m = np.zeros((T, T), dtype=bool)
    m[np.arange(T), np.arange(T)] = True  # padding queries see only themselves (no NaN rows)
    return m


def split_fused_batch(batch: ForwardBatch, row_lens: Iterable[int], fused: Mapping[int, FusedRow]) -> SplitBatches:
    """Split a packed batch with fused rows into a verify batch and a prospective batch.

    ``row_lens``: real tokens of each row (the rest is right padding); ``fused``: row index ->
    layout for the FUSED rows. The verify batch keeps every row, with the fused rows cut to their
    verify part (so it is exactly what the step would run without overlap). The prospective batch
    has one row per fused row: ``[s, d1 .. d(shared-1), first, MASK x (block-1)]``, the first
    ``shared`` tokens causal and draft gate 0 (as in the verify row), the block with the fused row's
    own mask and gate over them and itself, ``write_kv=False``, same slots and past lengths.
    """
    B, T = batch.input_ids.shape
    row_lens = [int(x) for x in row_lens]
    if len(row_lens) != B:
        raise ValueError(f"row_lens has {len(row_lens)} entries for {B} rows")
    for b, lay in fused.items():
        if not 0 <= b < B:
            raise ValueError(f"fused row {b} outside the batch of {B} rows")
        if not 1 <= lay.shared <= lay.verify_len or lay.block < 1:
            raise ValueError(f"row {b}: invalid fused layout {lay}")
        if lay.verify_len + lay.block != row_lens[b]:
            raise ValueError(f"row {b}: verify_len + block = {lay.verify_len + lay.block} != row length {row_lens[b]}")
    vlens = [fused[b].verify_len if b in fused else row_lens[b] for b in range(B)]
    Tv = max(vlens) if vlens else 0
    ids = np.zeros((B, Tv), np.int64)
    pos = np.zeros((B, Tv), np.int64)
    intra = np.broadcast_to(_pad_row_mask(Tv), (B, Tv, Tv)).copy()
    gate = np.zeros((B, Tv), np.float32)
    for b, n in enumerate(vlens):
        ids[b, :n] = batch.input_ids[b, :n]
        pos[b, :n] = batch.position_ids[b, :n]
        pos[b, n:] = batch.position_ids[b, n - 1] if n else 0
        intra[b, :n, :n] = batch.intra_mask[b, :n, :n]
        gate[b, :n] = batch.draft_gate[b, :n]
    verify = dataclasses.replace(batch, input_ids=ids, position_ids=pos, intra_mask=intra, draft_gate=gate,
                                 row_lens=np.array(vlens, np.int64))

    rows = sorted(fused)
    if not rows:
        return SplitBatches(verify, None, (B, T))
    lays = [fused[b] for b in rows]
    Tp = max(lay.shared + lay.block for lay in lays)
    P = len(rows)
    pids = np.zeros((P, Tp), np.int64)
    ppos = np.zeros((P, Tp), np.int64)
    pintra = np.broadcast_to(_pad_row_mask(Tp), (P, Tp, Tp)).copy()
    pgate = np.zeros((P, Tp), np.float32)
    for i, (b, lay) in enumerate(zip(rows, lays)):
        n, s, k = lay.verify_len, lay.shared, lay.block
        pids[i, :s] = batch.input_ids[b, :s]
        pids[i, s:s + k] = batch.input_ids[b, n:n + k]
        ppos[i, :s] = batch.position_ids[b, :s]
        ppos[i, s:s + k] = batch.position_ids[b, n:n + k]
        ppos[i, s + k:] = ppos[i, s + k - 1]
        # The prospective part keeps the fused row's own mask (its seed convention included).
        pintra[i, :s, :s] = batch.intra_mask[b, :s, :s]
        pintra[i, s:s + k, :s] = batch.intra_mask[b, n:n + k, :s]
        pintra[i, s:s + k, s:s + k] = batch.intra_mask[b, n:n + k, n:n + k]
        pgate[i, :s] = batch.draft_gate[b, :s]
        pgate[i, s:s + k] = batch.draft_gate[b, n:n + k]
    idx = np.array(rows, np.int64)
    prospective = ForwardBatch(
        slots=np.asarray(batch.slots)[idx].copy(), past_lens=np.asarray(batch.past_lens)[idx].copy(),
        input_ids=pids, position_ids=ppos, intra_mask=pintra, draft_gate=pgate,
        want_logits=np.asarray(batch.want_logits)[idx].copy(), write_kv=False,
        row_lens=np.array([lay.shared + lay.block for lay in lays], np.int64))
    return SplitBatches(verify, prospective, (B, T), rows, lays)


def split_overlap_plan(verify_batch: ForwardBatch, prospective_batch: ForwardBatch | None) -> StreamPlan:
    """The two-stream plan of one step: ``verify`` (verify stream, writes K/V) and ``prospective``
    (draft stream, ``write_kv=False``), independent of each other; the executor joins both.

    Raises ValueError when a slot appears in both batches with different past lengths (the
    prospective draft must read exactly the committed prefix the verify extends).
    """
    if not verify_batch.write_kv:
        raise ValueError("the verify forward must write K/V")
    ops = [Op("verify", VERIFY_STREAM, verify_batch)]
    if prospective_batch is not None and len(prospective_batch.slots):
        committed = {int(s): int(p) for s, p in zip(verify_batch.slots, verify_batch.past_lens)}
        for s, p in zip(prospective_batch.slots, prospective_batch.past_lens):
            if int(s) in committed and committed[int(s)] != int(p):
                raise ValueError(f"slot {int(s)}: prospective past length {int(p)} != verify past length "
                                 f"{committed[int(s)]}")
        if prospective_batch.write_kv:
            prospective_batch = dataclasses.replace(prospective_batch, write_kv=False)
        ops.append(Op("prospective", DRAFT_STREAM, prospective_batch))
    return StreamPlan(ops)


def sequential_draft_verify_plan(draft_batch: ForwardBatch, verify_batch: ForwardBatch) -> StreamPlan:
    """Baseline for timing: a draft forward, then the verify forward that depends on it."""
    return StreamPlan([Op("draft", DRAFT_STREAM, dataclasses.replace(draft_batch, write_kv=False)),
                       Op("verify", VERIFY_STREAM, verify_batch, depends_on=("draft",))])


def merge_split_outputs(split: SplitBatches, outputs: Mapping[str, ForwardOutput]) -> ForwardOutput:
    """Outputs of the split plan laid out like one fused forward over ``split.fused_shape``.

    Positions not produced by either forward (padding) are zero; the verify part of every row and
    the prospective block of fused rows (at ``[verify_len, verify_len + block)``) are filled.
    """
    B, T = split.fused_shape
    v = outputs["verify"]
    Tv = v.argmax.shape[1]
    argmax = np.zeros((B, T), np.int64)
    top_ids = np.zeros((B, T) + v.top_ids.shape[2:], np.int64)
    top_probs = np.zeros((B, T) + v.top_probs.shape[2:], np.float32)
    argmax[:, :Tv] = v.argmax
    top_ids[:, :Tv] = v.top_ids
    top_probs[:, :Tv] = v.top_probs
    p = outputs.get("prospective") if split.prospective is not None else None
    want = v.logits is not None or (p is not None and p.logits is not None)
    logits = None
    if want:
        vocab = (v.logits if v.logits is not None else p.logits).shape[-1]  # type: ignore[union-attr]
        logits = np.zeros((B, T, vocab), np.float32)
        if v.logits is not None:
            logits[:, :Tv] = v.logits
    lse = None  # kept where every part has it
    if v.lse is not None and (p is None or p.lse is not None):
        lse = np.zeros((B, T), np.float32)
        lse[:, :Tv] = v.lse
    if p is not None:
        for i, (b, lay) in enumerate(zip(split.prospective_rows, split.layouts)):
            n, s, k = lay.verify_len, lay.shared, lay.block
            argmax[b, n:n + k] = p.argmax[i, s:s + k]
            top_ids[b, n:n + k] = p.top_ids[i, s:s + k]
            top_probs[b, n:n + k] = p.top_probs[i, s:s + k]
            if logits is not None and p.logits is not None:
                logits[b, n:n + k] = p.logits[i, s:s + k]
            if lse is not None:
                lse[b, n:n + k] = p.lse[i, s:s + k]
    return ForwardOutput(argmax=argmax, top_ids=top_ids, top_probs=top_probs, logits=logits, lse=lse)


# ------------------------------------------------------------------------------------------------
# Executors
# ------------------------------------------------------------------------------------------------
class _TraceMixin:
    def _reset_trace(self) -> None:
        self.trace: list[TraceEvent] = []
        self._lock = threading.Lock()

    def _mark(self, op: Op, kind: str, t: float | None = None) -> None:
        with self._lock:
            self.trace.append(TraceEvent(op.name, op.stream, kind, time.perf_counter() if t is None else t))


class SequentialExecutor(_TraceMixin):
    """Runs the ops one after the other in submission order on the calling thread."""

    name = "sequential"

    def __init__(self) -> None:
        self._reset_trace()

    def run(self, plan: StreamPlan, backend: Any) -> dict[str, ForwardOutput]:
        self._reset_trace()
        out: dict[str, ForwardOutput] = {}
        for op in plan.topological():
            self._mark(op, "start")
            out[op.name] = backend.forward(op.batch)
            self._mark(op, "end")
        return out


class ThreadedExecutor(_TraceMixin):
    """One worker thread per stream; an op waits for its dependencies' ``threading.Event``.

    Ops of one stream run in submission order on that stream's thread. A failing op still sets
    its event; its dependents are skipped and :meth:`run` re-raises the first error. ``delays``
    (op name -> seconds, tests only) sleeps inside an op to provoke interleavings.
    """

    name = "threaded"

    def __init__(self, delays: Mapping[str, float] | None = None, timeout: float = 600.0) -> None:
        self.delays = dict(delays or {})
        self.timeout = timeout
        self._reset_trace()

    def run(self, plan: StreamPlan, backend: Any) -> dict[str, ForwardOutput]:
        self._reset_trace()
        done = {op.name: threading.Event() for op in plan.ops}
        out: dict[str, ForwardOutput] = {}
        errors: dict[str, BaseException] = {}

        def worker(ops: list[Op]) -> None:
            for op in ops:
                try:
                    for dep in op.depends_on:
                        if not done[dep].wait(self.timeout):
                            raise TimeoutError(f"op {op.name!r}: dependency {dep!r} did not finish")
                        if dep in errors:
                            raise RuntimeError(f"op {op.name!r} skipped: dependency {dep!r} failed")
                    self._mark(op, "start")
                    if op.name in self.delays:
                        time.sleep(self.delays[op.name])
                    result = backend.forward(op.batch)
                    self._mark(op, "end")
                    out[op.name] = result
                except BaseException as exc:  # recorded and re-raised by run()
                    errors[op.name] = exc
                finally:
                    done[op.name].set()

        threads = [threading.Thread(target=worker, args=([op for op in plan.ops if op.stream == s],),
                                    name=f"recguide-stream-{s}", daemon=True) for s in plan.streams]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for op in plan.ops:  # first failure in submission order
            if op.name in errors:
                raise errors[op.name]
        return out


class TorchCudaStreamExecutor(_TraceMixin):
    """``torch.cuda.Stream`` per stream name; dependencies and the join as ``torch.cuda.Event``.

    Every stream first waits for the current stream (the previous step's commit); each op is
    enqueued with ``backend.launch(batch, stream)`` after its stream waited for its dependencies'
    end events; then all are collected and the current stream waits for every stream, so later
    work sees the verify's K/V writes. The trace holds device times (CUDA events, seconds since
    the plan's first event).
    """

    name = "torch-cuda-streams"

    def __init__(self, device: Any = None) -> None:
        import torch

        self.device = torch.device(device if device is not None else "cuda")
        self._streams: dict[str, Any] = {}
        self._reset_trace()

    def stream(self, name: str) -> Any:
        import torch

        if name not in self._streams:
            self._streams[name] = torch.cuda.Stream(device=self.device)
        return self._streams[name]

    def run(self, plan: StreamPlan, backend: Any) -> dict[str, ForwardOutput]:
        import torch

        self._reset_trace()
        current = torch.cuda.current_stream(self.device)
        base = torch.cuda.Event(enable_timing=True)
        base.record(current)
        for name in plan.streams:
            self.stream(name).wait_event(base)
        ends: dict[str, Any] = {}
        starts: dict[str, Any] = {}
        pending: dict[str, Any] = {}
        for op in plan.ops:
            s = self.stream(op.stream)
            for dep in op.depends_on:
                s.wait_event(ends[dep])
            starts[op.name] = torch.cuda.Event(enable_timing=True)
            starts[op.name].record(s)
            pending[op.name] = backend.launch(op.batch, s)
            ends[op.name] = torch.cuda.Event(enable_timing=True)
            ends[op.name].record(s)
        out = {op.name: backend.collect(pending[op.name]) for op in plan.ops}
        for name in plan.streams:
            join = torch.cuda.Event()
            join.record(self.stream(name))
            current.wait_event(join)
        for op in plan.ops:
            ends[op.name].synchronize()
            self._mark(op, "start", base.elapsed_time(starts[op.name]) / 1e3)
            self._mark(op, "end", base.elapsed_time(ends[op.name]) / 1e3)
        return out


def _cudart() -> Any:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:  # older cuda-python
        from cuda import cudart  # type: ignore[no-redef]
    return cudart


def _ck(cudart: Any, result: Any, what: str) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        raise RuntimeError(f"{what} failed: {err}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


class CudaPythonStreamExecutor(_TraceMixin):
    """The same orchestration with cuda-python streams and events (for the TensorRT backend).

    The backend's own stream (``backend.stream``, else the legacy default stream) plays the role
    of the current stream: the plan's streams wait for it at the start and it waits for them at
    the end. ``backend.launch(batch, stream)`` takes a ``cudaStream_t``.
    """

    name = "cuda-python-streams"

    def __init__(self) -> None:
        self.cudart = _cudart()
        self._streams: dict[str, Any] = {}
        self._reset_trace()

    def stream(self, name: str) -> Any:
        rt = self.cudart
        if name not in self._streams:
            self._streams[name] = _ck(rt, rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking),
                                      "cudaStreamCreateWithFlags")
        return self._streams[name]

    def _event(self, timing: bool = True) -> Any:
        rt = self.cudart
        flags = rt.cudaEventDefault if timing else rt.cudaEventDisableTiming
        return _ck(rt, rt.cudaEventCreateWithFlags(flags), "cudaEventCreateWithFlags")

    def run(self, plan: StreamPlan, backend: Any) -> dict[str, ForwardOutput]:
        rt = self.cudart
        self._reset_trace()
        current = getattr(backend, "stream", None) or 0
        events: list[Any] = []

        def event(timing: bool = True) -> Any:
            ev = self._event(timing)
            events.append(ev)
            return ev

        try:
            base = event()
            _ck(rt, rt.cudaEventRecord(base, current), "cudaEventRecord")
            for name in plan.streams:
                _ck(rt, rt.cudaStreamWaitEvent(self.stream(name), base, 0), "cudaStreamWaitEvent")
            starts: dict[str, Any] = {}
            ends: dict[str, Any] = {}
            pending: dict[str, Any] = {}
            for op in plan.ops:
                s = self.stream(op.stream)
                for dep in op.depends_on:
                    _ck(rt, rt.cudaStreamWaitEvent(s, ends[dep], 0), "cudaStreamWaitEvent")
                starts[op.name] = event()
                _ck(rt, rt.cudaEventRecord(starts[op.name], s), "cudaEventRecord")
                pending[op.name] = backend.launch(op.batch, s)
                ends[op.name] = event()
                _ck(rt, rt.cudaEventRecord(ends[op.name], s), "cudaEventRecord")
            out = {op.name: backend.collect(pending[op.name]) for op in plan.ops}
            for name in plan.streams:
                join = event(timing=False)
                _ck(rt, rt.cudaEventRecord(join, self.stream(name)), "cudaEventRecord")
                _ck(rt, rt.cudaStreamWaitEvent(current, join, 0), "cudaStreamWaitEvent")
            for op in plan.ops:
                _ck(rt, rt.cudaEventSynchronize(ends[op.name]), "cudaEventSynchronize")
                t0 = _ck(rt, rt.cudaEventElapsedTime(base, starts[op.name]), "cudaEventElapsedTime")
                t1 = _ck(rt, rt.cudaEventElapsedTime(base, ends[op.name]), "cudaEventElapsedTime")
                self._mark(op, "start", t0 / 1e3)
                self._mark(op, "end", t1 / 1e3)
            return out
        finally:
            for ev in events:
                rt.cudaEventDestroy(ev)

    def close(self) -> None:
        for s in self._streams.values():
            self.cudart.cudaStreamDestroy(s)
        self._streams.clear()


EXECUTORS = {
    "sequential": SequentialExecutor,
    "threaded": ThreadedExecutor,
    "torch-cuda": TorchCudaStreamExecutor,
    "cuda-python": CudaPythonStreamExecutor,
}


def executor_for(backend: Any) -> Any:
    """The stream executor that fits ``backend``: CUDA streams where it has them, else threads."""
    name = getattr(backend, "name", "")
    if name == "torch" and getattr(getattr(backend, "device", None), "type", "cpu") == "cuda":
        return TorchCudaStreamExecutor(backend.device)
    if name == "tensorrt":
        return CudaPythonStreamExecutor()
    return ThreadedExecutor()
