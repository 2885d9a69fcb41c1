"""What one native forward costs, by shape, against the machine's two limits (bytes streamed, FLOPs).

A shape is ``rows × tokens`` over a cached past (a batch-1 block of 8 is ``1×8``; a batch-64 decode step
is ``64×1``). Per shape: the best of ``reps`` forwards (verify rows by default: causal, adapter off;
or draft or fused rows, :data:`ROW_KINDS`), the
ratio to the ``1×1`` step, the weight bytes streamed per forward over its time (GB/s) and the FLOPs
(2 × weights × tokens + attention) over its time (GFLOP/s). The machine's own read bandwidth and
FMA rate are measured in the same run by the extension (same threads, same vector path), so each
row can be read as a fraction of what this CPU can do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..backends.base import ForwardBatch
from ..model import masks

# torch loads inside the two functions that use it: scripts/bench_forward.py builds its options from this
# module's constants and answers --help without torch.

DEFAULT_SHAPES = ((1, 1), (1, 4), (1, 8), (1, 16), (1, 32), (8, 1), (64, 1))
ROW_KINDS = ("verify", "draft", "fused")
"""What a shape's rows are: causal verify rows (adapter off); draft blocks ``[seed, MASK × (T-1)]`` with
the draft adapter on; or RecGuide's fused rows, a T-token verify row followed by a T-token prospective
draft that shares the first T // 2 verify tokens (2T tokens per row), as the executor packs them."""


@dataclass
class ShapeCost:
    """One shape's best forward time and what it moved and computed."""

    rows: int
    tokens: int
    past: int
    ms: float
    weight_bytes: int
    flops: float
    rep_ms: tuple[float, ...] = ()
    """Every rep's time, in rep order (rep i of two backends ran side by side: :func:`paired_ratio`)."""

    @property
    def gbps(self) -> float:
        return self.weight_bytes / (self.ms * 1e-3) / 1e9

    @property
    def gflops(self) -> float:
        return self.flops / (self.ms * 1e-3) / 1e9


def median_ratio(a: Sequence[float], b: Sequence[float]) -> float | None:
    """The median over reps of ``a[i] / b[i]``, two times taken side by side in rep i (a rep where either is 0 is
    left out; None when none is left): on a shared CPU whose load comes in bursts, steadier than the ratio of two
    bests (a burst can spoil one side's every rep but one)."""
    rs = [x / y for x, y in zip(a, b) if x > 0 and y > 0]
    return float(np.median(rs)) if rs else None


def paired_ratio(a: ShapeCost, b: ShapeCost) -> float:
    """a's time / b's, the :func:`median_ratio` of their reps."""
    return median_ratio(a.rep_ms, b.rep_ms)


def weight_bytes(model) -> int:
    """Bytes of the projections and the head as the native backend stores them (bf16 where exact)."""
    import torch

    total = 0
    for name, p in model.named_parameters():
        if p.ndim != 2 or "embed_tokens" in name or "lora_" in name:
            continue
        exact = bool(torch.equal(p.detach().to(torch.bfloat16).float(), p.detach().float()))
        total += p.numel() * (2 if exact else 4)
    return total


def forward_flops(model, rows: int, tokens: int, past: int, prefill: bool = False) -> float:
    """2 × matrix weights × tokens, plus attention's scores and P·V over past + causal new keys. A
    ``prefill`` wants the head on each row's last token only: its head counts ``rows`` tokens."""
    cfg = model.config
    mats = {n: p.numel() for n, p in model.named_parameters()
            if p.ndim == 2 and "embed_tokens" not in n and "lora_" not in n}
    head = sum(v for n, v in mats.items() if "head" in n)
    n = rows * tokens
    keys = rows * sum(past + t + 1 for t in range(tokens))  # key positions each query sees
    attn = 2 * 2 * cfg.num_attention_heads * cfg.head_dim * keys * cfg.num_hidden_layers
    if prefill:
        return 2.0 * (sum(mats.values()) - head) * n + 2.0 * head * rows + attn
    return 2.0 * sum(mats.values()) * n + attn


def _causal_batch(slots: np.ndarray, tokens: int, past: int, seed: int, prefill: bool,
                  row_lens: Sequence[int] | None = None) -> ForwardBatch:
    """Causal rows of ``tokens`` random ids in ``slots`` over a cached past of ``past``; ``prefill``: the
    cache written and outputs from each row's last token only, as the engine prefills a prompt. ``row_lens``:
    each row's real tokens where they differ (the rows padded to ``tokens``)."""
    rows = len(slots)
    return ForwardBatch(slots=slots, past_lens=np.full(rows, past, np.int64),
                        input_ids=np.random.default_rng(seed).integers(100, 1000, (rows, tokens)),
                        position_ids=np.tile(past + np.arange(tokens), (rows, 1)),
                        intra_mask=np.tile(np.tri(tokens, dtype=bool), (rows, 1, 1)),
                        draft_gate=np.zeros((rows, tokens), np.float32), want_logits=np.zeros(rows, bool),
                        row_lens=np.full(rows, tokens) if row_lens is None else np.asarray(row_lens, np.int64),
                        write_kv=prefill, last_only=prefill)


def verify_batch(rows: int, tokens: int, past: int, prefill: bool = False) -> ForwardBatch:
    """``rows`` causal rows of ``tokens`` over a cached past; ``prefill``: a prompt prefill instead (no
    past, the cache written, outputs from each row's last token only, as the engine prefills)."""
    return _causal_batch(np.arange(rows, dtype=np.int64), tokens, 0 if prefill else past, rows * 1000 + tokens,
                         prefill)


def ragged_verify_batch(lens: Sequence[int], past: int) -> ForwardBatch:
    """Causal rows of ``lens[i]`` tokens in slots 0 … len(lens) - 1 over a cached past (a lookup verify beside AR
    rows, packed as the engine packs them), the cache left as it is."""
    return _causal_batch(np.arange(len(lens), dtype=np.int64), max(lens), past, sum(lens) * 1000 + len(lens),
                         False, lens)


def draft_batch(rows: int, tokens: int, past: int, kind: str, mask_id: int, seed_causal: bool) -> ForwardBatch:
    """``rows`` rows of ``kind`` (:data:`ROW_KINDS`: "draft" or "fused") over a cached past, built as
    :class:`~recguide_trt.runtime.executor.Executor` builds them."""
    rng = np.random.default_rng(rows * 1000 + tokens)
    if kind == "draft":
        ids = np.tile([500] + [mask_id] * (tokens - 1), (rows, 1))
        pos = np.tile(past + np.arange(tokens), (rows, 1))
        intra, gate = masks.draft_block(tokens, seed_causal), masks.draft_gate(tokens, seed_causal)
    elif kind == "fused":
        shared = tokens // 2
        ids = np.concatenate([rng.integers(100, 1000, (rows, tokens)),
                              np.tile([600] + [mask_id] * (tokens - 1), (rows, 1))], 1)
        pos = np.tile(np.concatenate([past + np.arange(tokens), past + shared + np.arange(tokens)]), (rows, 1))
        intra = masks.fused_rows(tokens, shared, tokens, seed_causal)
        gate = np.concatenate([np.zeros(tokens, np.float32), masks.draft_gate(tokens, seed_causal)])
    else:
        raise ValueError(f"kind must be 'draft' or 'fused', got {kind!r}")
    n = ids.shape[1]
    return ForwardBatch(slots=np.arange(rows, dtype=np.int64), past_lens=np.full(rows, past, np.int64),
                        input_ids=ids, position_ids=pos, intra_mask=np.tile(intra, (rows, 1, 1)),
                        draft_gate=np.tile(gate, (rows, 1)), want_logits=np.zeros(rows, bool),
                        row_lens=np.full(rows, n))


def fill_past(backend, rows: int, past: int) -> None:
    """Give slots 0 … rows-1 a cached past of ``past`` tokens (prefill in chunks of 4 rows)."""
    for r0 in range(0, rows, 4):
        backend.forward(_causal_batch(np.arange(r0, min(rows, r0 + 4), dtype=np.int64), past, 0, r0, prefill=True))


def shape_batches(model, shapes, pasts: dict, prefill: bool = False, kind: str = "verify", ar_past: int = 0) -> dict:
    """The batch of each shape (``pasts``: each shape's cached tokens); for draft and fused rows also the
    1-token AR step over ``ar_past`` under the key ``"ar"`` (what "× the 1×1 step" divides by)."""
    if kind == "verify":
        return {shape: verify_batch(shape[0], shape[1], pasts[shape], prefill) for shape in shapes}
    batches = {shape: draft_batch(shape[0], shape[1], pasts[shape], kind, model.config.mask_token_id,
                                  model.config.draft_seed_causal) for shape in shapes}
    batches["ar"] = verify_batch(1, 1, ar_past)
    return batches


def turns(backends: dict, rep: int) -> list:
    """The (name, backend) pairs of one rep, in turn: the order reversed every other rep, so that no backend
    always runs right after another and finds the caches and the prefetchers as that one left them."""
    items = list(backends.items())
    return items if rep % 2 == 0 else items[::-1]


def phase_times(backends: dict, batches: dict, reps: int) -> tuple[dict, dict]:
    """Per backend and batch: the native backend's own phase timers (ms: norms, projections, attention, MLP,
    head, ...) and the forward's wall time under ``"total"``, of every one of ``reps`` forwards, the backends
    taking :func:`turns` rep by rep. Returns (each one's fastest forward, every forward:
    ``{name: {batch key: [phases, ...]}}``, for :func:`paired_phase_ratios`). Run after
    :func:`time_shapes` (the slots hold their pasts); the timers add a clock read per phase."""
    every: dict = {name: {} for name in backends}
    for rep in range(reps):
        for key, batch in batches.items():
            for name, be in turns(backends, rep):
                time.sleep(0.003)  # the other build's pool workers stop spinning before this one runs
                be.set_timing(True)  # resets the timers
                t0 = time.perf_counter()
                be.forward(batch)
                total = time.perf_counter() - t0
                every[name].setdefault(key, []).append(
                    {"total": total * 1e3, **{k: v * 1e3 for k, v in be.timings().items()}})
    for be in backends.values():
        be.set_timing(False)
    best = {name: {key: min(runs, key=lambda r: r["total"]) for key, runs in per.items()}
            for name, per in every.items()}
    return best, every


def paired_phase_ratios(before: list, now: list) -> dict:
    """Per phase (and ``"total"``), the median over reps of before / now, each rep's two forwards timed side
    by side (:func:`median_ratio`); a phase at zero in either forward is left out of its median."""
    ratios = {name: median_ratio([b[name] for b in before], [n[name] for n in now]) for name in now[0]}
    return {name: r for name, r in ratios.items() if r is not None}


def time_shapes(backends: dict, model, shapes, past: int, reps: int, past_for: dict | None = None,
                prefill: bool = False, kind: str = "verify", after_rep: Callable[[int], None] | None = None) -> dict:
    """Best-of-``reps`` ms per (backend name, shape), interleaved rep by rep over shapes and backends
    (a shared CPU's load drifts: every ratio compares forwards timed side by side). ``prefill``: each
    shape is a prompt prefill (:func:`verify_batch`), over no past. ``kind``: the rows' kind
    (:data:`ROW_KINDS`); draft and fused rows need a model with a draft adapter, their FLOPs count the
    base weights on every token (the adapter's are left out), and the 1-token AR step is timed beside
    them under the shape key ``"ar"``. ``after_rep(rep)`` runs after each rep's forwards (a probe of the
    machine timed between them: :func:`stream_probe`)."""
    if kind not in ROW_KINDS:
        raise ValueError(f"kind must be one of {', '.join(ROW_KINDS)}, got {kind!r}")
    if kind != "verify" and (prefill or not model.has_draft_adapter):
        raise ValueError("draft and fused rows need a model with a draft adapter, over a cached past")
    past_for = {} if prefill else past_for or {}
    past = 0 if prefill else past
    pasts = {shape: past_for.get(shape, past) for shape in shapes}
    if not prefill:
        for be in backends.values():  # one fill for all shapes: a shorter past reads a prefix of a longer one
            fill_past(be, max(r for r, _ in shapes), max(pasts.values()))
    batches = shape_batches(model, shapes, pasts, prefill, kind, ar_past=past)
    if kind != "verify":
        pasts["ar"] = past
    shapes = list(batches)
    times: dict = {}
    for rep in range(reps):
        for shape in shapes:
            for name, be in turns(backends, rep):
                time.sleep(0.003)  # the other build's pool workers stop spinning before this one runs
                t0 = time.perf_counter()
                be.forward(batches[shape])
                times.setdefault((name, shape), []).append((time.perf_counter() - t0) * 1e3)
        if after_rep is not None:
            after_rep(rep)
    wb = weight_bytes(model)
    per_row = 2 if kind == "fused" else 1  # a fused row carries 2T tokens
    costs = {}
    for (name, shape), ts in times.items():
        rows, tokens = (1, 1) if shape == "ar" else shape
        scale = 1 if shape == "ar" else per_row
        costs[(name, shape)] = ShapeCost(rows, tokens, pasts[shape], min(ts), wb,
                                         forward_flops(model, rows, scale * tokens, pasts[shape], prefill),
                                         tuple(ts))
    return costs


def stream_probe(ext, threads: int, mib: int = 512) -> Callable[[], float]:
    """A read-bandwidth probe (GB/s, one pass over a ``mib`` MiB buffer on ``threads`` threads) to time between a
    benchmark's reps: on a host whose neighbours share its memory bus, the bandwidth moved 30-59 GB/s from one
    minute to the next (the 2-core Zen 4 EPYC, 2026-12-07), so a forward is compared with the bandwidth of its
    own minute, not with one reading taken before the run."""
    import torch

    buf = torch.ones(mib << 18, dtype=torch.float32)
    return lambda: float(ext.stream_gbps(buf, threads, 1))


def machine_limits(ext, threads: int, seconds: float = 0.5) -> dict[str, float]:
    """Read bandwidth (GB/s, 1 GiB buffer, best of 3), float32 FMA rate and bf16 dot rate (GFLOP/s; the
    latter is ``compute_dtype="bfloat16"``'s instruction, emulated where the CPU lacks AVX512_BF16) on
    ``threads`` threads."""
    import torch

    buf = torch.ones(1 << 28, dtype=torch.float32)
    return {"stream_GBps": float(ext.stream_gbps(buf, threads, 3)),
            "fma_GFLOPs": float(ext.fma_gflops(threads, seconds)),
            "bf16_dot_GFLOPs": float(ext.bf16_dot_gflops(threads, seconds))}
