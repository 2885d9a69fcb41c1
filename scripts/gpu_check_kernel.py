#!/usr/bin/env python
"""GPU check of the fused mismatch kernel: build with nvcc, compare with the reference, time it.

    python scripts/gpu_check_kernel.py [--rows 64] [--length 32] [--vocab 131072] [--check-rows 16]

Needs a CUDA GPU, nvcc and cuda-python; the torch comparison runs only with a CUDA build of torch.
Prints a small table: kernel vs. a torch-on-CUDA equivalent (masked softmax + topk + flag), per dtype.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recguide_trt.engine import plugin_lib  # noqa: E402
from recguide_trt.runtime.mismatch import predict_mismatch, topk_reference  # noqa: E402


def _cudart():
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        from cuda import cudart  # type: ignore[no-redef]
    return cudart


def _ck(cudart, res):
    err, *rest = res if isinstance(res, tuple) else (res,)
    if err != cudart.cudaError_t.cudaSuccess:
        raise RuntimeError(f"CUDA call failed: {err}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


def make_logits(rng: np.random.Generator, rows: int, length: int, vocab: int, mask_id: int, eos_id: int,
                dtype) -> np.ndarray:
    x = rng.standard_normal((rows, length, vocab), dtype=np.float32) * 2.0
    top = x.max(-1)
    kind = rng.integers(0, 5, size=(rows, length))
    r, i = np.nonzero(kind == 0)
    x[r, i, mask_id] = top[r, i] + 5.0                    # MASK is the arg-max
    r, i = np.nonzero(kind == 1)
    a = rng.integers(0, vocab - 2, size=r.size)
    x[r, i, a] = top[r, i] + 1.0                          # EOS is rank 2, close
    x[r, i, eos_id] = top[r, i] + 0.9
    r, i = np.nonzero(kind == 2)
    for k in range(3):                                    # exact ties at the top
        x[r, i, (7919 * (k + 1) + r) % (vocab - 2)] = top[r, i] + 1.0
    r, i = np.nonzero(kind == 3)
    x[r, i, (r * 31 + i) % (vocab - 2)] = top[r, i] + 12.0  # confident
    return x.astype(dtype)


def run_kernel(fn, cudart, d_in, dtype_code, d_len, rows, length, vocab, mask_id, eos_id, tau, d_out):
    err = fn(d_in, dtype_code, d_len, rows, length, vocab, mask_id, eos_id, tau, *d_out, None)
    if err != 0:
        raise RuntimeError(f"launcher returned cudaError_t {err}")


def time_cuda(cudart, call, iters: int) -> float:
    for _ in range(3):
        call()
    start = _ck(cudart, cudart.cudaEventCreate())
    stop = _ck(cudart, cudart.cudaEventCreate())
    _ck(cudart, cudart.cudaEventRecord(start, 0))
    for _ in range(iters):
        call()
    _ck(cudart, cudart.cudaEventRecord(stop, 0))
    _ck(cudart, cudart.cudaEventSynchronize(stop))
    ms = _ck(cudart, cudart.cudaEventElapsedTime(start, stop))
    return float(ms) / iters


def torch_equivalent(torch, logits, lengths, mask_id: int, eos_id: int, tau: float):
    mask = torch.tensor([mask_id], device=logits.device)
    x = logits.float().index_fill(-1, mask, float("-inf"))  # out of place: the input stays intact
    p = torch.softmax(x, dim=-1)
    vals, ids = torch.topk(x, 3, dim=-1)
    probs = p.gather(-1, ids[..., :2])
    risk = 1.0 - (probs[..., 0] - probs[..., 1])
    pos = torch.arange(x.shape[1], device=x.device)
    risky = (risk > tau) & (pos >= 1) & (pos < lengths[:, None])
    first = torch.where(risky.any(-1), risky.float().argmax(-1), torch.full_like(lengths, -1))
    cand = ids[torch.arange(x.shape[0], device=x.device), first.clamp(min=0)]
    corr = torch.where(cand[:, 1] != eos_id, cand[:, 1], cand[:, 2])
    return ids, probs, first, torch.where(first >= 0, corr, torch.full_like(corr, -1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--length", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=131072)
    ap.add_argument("--tau", type=float, default=0.5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--check-rows", type=int, default=16, help="rows compared with the numpy reference")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    rows, length, vocab, tau = args.rows, args.length, args.vocab, args.tau
    mask_id, eos_id = vocab - 1, vocab - 2

    cudart = _cudart()
    err, count = cudart.cudaGetDeviceCount()
    if err != cudart.cudaError_t.cudaSuccess or count == 0:
        print(f"no CUDA GPU ({err}); nothing to check", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    lib = plugin_lib.compile_nvcc(tempfile.mkdtemp(prefix="recguide_mismatch_"), arch=args.arch)
    print(f"built {lib} in {time.perf_counter() - t0:.1f}s")
    fn = plugin_lib.load_launcher(lib)

    try:
        import torch

        have_torch = torch.cuda.is_available()
    except ImportError:
        torch, have_torch = None, False

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, length + 1, size=rows).astype(np.int32)
    lengths[0] = length
    table = []
    ok = True
    for dtype, code in ((np.float32, plugin_lib.DTYPE_F32), (np.float16, plugin_lib.DTYPE_F16)):
        logits = make_logits(rng, rows, length, vocab, mask_id, eos_id, dtype)
        host_out = [np.zeros((rows, length, 3), np.int32), np.zeros((rows, length, 2), np.float32),
                    np.zeros(rows, np.int32), np.zeros(rows, np.int32)]
        ptrs = []

        def upload(a, ptrs=ptrs):
            p = int(_ck(cudart, cudart.cudaMalloc(a.nbytes)))
            ptrs.append(p)
            _ck(cudart, cudart.cudaMemcpy(p, a.ctypes.data, a.nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice))
            return p

        try:
            d_in, d_len = upload(logits), upload(lengths)
            d_out = [upload(h) for h in host_out]
            run_kernel(fn, cudart, d_in, code, d_len, rows, length, vocab, mask_id, eos_id, tau, d_out)
            _ck(cudart, cudart.cudaDeviceSynchronize())
            for p, h in zip(d_out, host_out):
                _ck(cudart, cudart.cudaMemcpy(h.ctypes.data, p, h.nbytes,
                                              cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost))
            top_ids, top_probs, flag_pos, correction = host_out
            n_bad = 0
            for r in range(min(rows, args.check_rows)):
                n = int(lengths[r])
                ids, probs = topk_reference(logits[r, :n], mask_id)
                # the flag step is exact given the kernel's own top-k (a risk within float error of tau
                # could flip against the float64 reference)
                own = predict_mismatch(top_ids[r, :n], top_probs[r, :n], tau, eos_id)
                good = (np.array_equal(top_ids[r, :n], ids)
                        and np.allclose(top_probs[r, :n], probs, rtol=1e-4, atol=2e-6)
                        and (int(flag_pos[r]), int(correction[r])) == (own.position, own.correction))
                n_bad += not good
            ok &= n_bad == 0
            ms = time_cuda(cudart, lambda d_in=d_in, d_len=d_len, d_out=d_out, code=code: run_kernel(
                fn, cudart, d_in, code, d_len, rows, length, vocab, mask_id, eos_id, tau, d_out), args.iters)
        finally:
            for p in ptrs:
                cudart.cudaFree(p)
        torch_ms = float("nan")
        if have_torch:
            tl = torch.from_numpy(logits).cuda()
            tlen = torch.from_numpy(lengths).long().cuda()
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(3):
                torch_equivalent(torch, tl, tlen, mask_id, eos_id, tau)
            start.record()
            for _ in range(args.iters):
                torch_equivalent(torch, tl, tlen, mask_id, eos_id, tau)
            stop.record()
            torch.cuda.synchronize()
            torch_ms = start.elapsed_time(stop) / args.iters
            del tl
        read_gb = float(lengths.sum()) * vocab * np.dtype(dtype).itemsize / 1e9
        table.append((np.dtype(dtype).name, n_bad, min(rows, args.check_rows), ms, torch_ms, read_gb / (ms / 1e3)))

    print(f"\nrows={rows} L={length} V={vocab} tau={tau} (valid positions: {int(lengths.sum())})")
    print(f"{'dtype':8} {'mismatch':>9} {'kernel ms':>10} {'torch ms':>9} {'speedup':>8} {'GB/s':>7}")
    for name, bad, checked, ms, tms, gbs in table:
        print(f"{name:8} {bad:>4}/{checked:<4} {ms:10.3f} {tms:9.3f} {tms / ms:8.1f} {gbs:7.0f}")
    print("OK" if ok else "MISMATCH against the reference")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
