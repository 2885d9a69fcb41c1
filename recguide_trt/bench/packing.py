"""Forward-level benchmark: one packed step with rows of mixed lengths, padded vs packed.

Times the same :class:`~recguide_trt.backends.base.ForwardBatch` twice on the torch backend —
once with ``row_lens`` (the backend skips padding in its token-wise layers) and once without
(every row padded to the longest) — alternating the two so machine drift hits both alike, and
prints the medians and their ratio. The mixes are the steps RecGuide and continuous batching
produce: many AR rows next to a few draft / verify / fused rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np

from ..backends.base import ForwardBatch
from ..model import masks
from ..models.names import MODEL_HELP

DEFAULT_MIXES = ("16x1", "15x1+1x16", "14x1+2x16", "8x1+8x8", "7x1+1x16", "4x8", "1x1+1x32")
"""Step mixes: ``NxT`` terms, N rows of T new tokens each."""


def parse_mix(mix: str) -> list[int]:
    """``"15x1+1x16"`` -> fifteen rows of 1 token and one of 16 (ValueError on a malformed mix)."""
    lens: list[int] = []
    for term in mix.split("+"):
        try:
            n, t = (int(v) for v in term.lower().split("x"))
        except ValueError:
            raise ValueError(f"bad mix term {term!r} in {mix!r}: expected ROWSxTOKENS, e.g. 15x1+1x16") from None
        if n < 1 or t < 1:
            raise ValueError(f"bad mix term {term!r} in {mix!r}: rows and tokens must be >= 1")
        lens += [t] * n
    return lens


def mixed_batch(lens: list[int], past_len: int, vocab_size: int, seed: int = 0) -> ForwardBatch:
    """Rows of the given lengths: 1-token rows are AR steps, longer rows draft blocks (gated)."""
    rng = np.random.default_rng(seed)
    B, T = len(lens), max(lens)
    intra = np.zeros((B, T, T), bool)
    intra[:, np.arange(T), np.arange(T)] = True
    gate = np.zeros((B, T), np.float32)
    for b, n in enumerate(lens):
        intra[b, :n, :n] = masks.causal(n) if n == 1 else masks.draft_block(n, seed_causal=True)
        gate[b, :n] = 0.0 if n == 1 else masks.draft_gate(n, seed_causal=True)
    pos = np.minimum(past_len + np.arange(T)[None, :], past_len + np.array(lens)[:, None] - 1)
    return ForwardBatch(slots=np.arange(B), past_lens=np.full(B, past_len), input_ids=rng.integers(4, vocab_size, (B, T)),
                        position_ids=pos, intra_mask=intra, draft_gate=gate, want_logits=np.zeros(B, bool),
                        row_lens=np.array(lens), write_kv=False)


def time_mix(backend, lens: list[int], past_len: int, reps: int) -> tuple[float, float]:
    """Median seconds of the step (padded, packed), the two alternated ``reps`` times."""
    packed = mixed_batch(lens, past_len, backend.vocab_size)
    padded = dataclasses.replace(packed, row_lens=None)
    times: dict[str, list[float]] = {"padded": [], "packed": []}
    for batch in (padded, packed):
        backend.forward(batch)  # warm-up
    for _ in range(reps):
        for name, batch in (("padded", padded), ("packed", packed)):
            t0 = time.perf_counter()
            backend.forward(batch)
            times[name].append(time.perf_counter() - t0)
    return statistics.median(times["padded"]), statistics.median(times["packed"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--mixes", default=",".join(DEFAULT_MIXES), help="comma-separated ROWSxTOKENS[+...] mixes")
    p.add_argument("--past-len", type=int, default=128, help="cached prefix of every row")
    p.add_argument("--reps", type=int, default=30, help="timed forwards per variant and mix")
    args = p.parse_args(argv)
    if args.reps < 1 or args.past_len < 0:
        p.error("--reps must be >= 1 and --past-len >= 0")
    try:
        mixes = [(m, parse_mix(m)) for m in args.mixes.split(",") if m.strip()]
    except ValueError as exc:
        p.error(str(exc))
    from ..backends.torch_backend import TorchBackend
    from ..model.checkpoint import load_checkpoint
    from ..models import resolve_model

    model = load_checkpoint(resolve_model(args.model)).model
    rows = max(len(lens) for _, lens in mixes)
    backend = TorchBackend(model, max_slots=rows, slot_capacity=args.past_len + max(max(lens) for _, lens in mixes))
    print("| step mix (rows x tokens) | padded ms | packed ms | padded / packed |")
    print("|:---|---:|---:|---:|")
    for name, lens in mixes:
        padded, packed = time_mix(backend, lens, args.past_len, args.reps)
        print(f"| {name} | {padded * 1e3:.2f} | {packed * 1e3:.2f} | {padded / packed:.2f} |", flush=True)
    return 0
