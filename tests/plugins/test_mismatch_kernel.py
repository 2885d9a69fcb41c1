"""The fused mismatch-prediction kernel (plugins/mismatch_predict.cu) against the reference.

Layers, from cheapest to the real thing:
* the reference itself on hand-built logits (pure numpy);
* NVRTC compiles the source for sm_90 (needs cuda-python + nvidia-cuda-nvrtc, no GPU);
* nvcc builds the shared library exporting the C launcher (needs nvcc, no GPU);
* the device code compiled for the host by g++ with a small SIMT shim (one std::thread per CUDA
  thread, barriers for __syncthreads/__shfl_down_sync), compared with the reference: checks the
  reductions, tie-breaking, alignment paths and the flag step without a GPU;
* the real kernel via ctypes on a GPU (``@pytest.mark.gpu``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recguide_trt.engine import plugin_lib
from recguide_trt.runtime.mismatch import MismatchPrediction, predict_mismatch, topk_reference

V_SMALL, MASK, EOS = 8, 7, 6
CONFIDENT = 10.0


def _row(*pairs: tuple[int, float], v: int = V_SMALL) -> np.ndarray:
    x = np.zeros(v, np.float32)
    for tok, val in pairs:
        x[tok] = val
    return x


def _ref_row(logits: np.ndarray, tau: float = 0.5, drafted: np.ndarray | None = None) -> MismatchPrediction:
    ids, probs = topk_reference(logits, MASK)
    return predict_mismatch(ids, probs, tau, EOS, drafted=drafted)


# --------------------------------------------------------------------------------------------------
# Reference semantics on hand-built logits
# --------------------------------------------------------------------------------------------------

def test_reference_mask_highest_is_excluded():
    block = np.stack([
        _row((0, 1.0), (1, 1.0)),                 # position 0: risky, but it is the seed
        _row((4, CONFIDENT)),                     # confident
        _row((MASK, 20.0), (3, 2.0), (1, 1.9)),   # MASK on top -> top-1 3, top-2 1, risky
        _row((5, 1.0), (2, 1.0)),                 # risky too, but after the first flag
    ])
    ids, probs = topk_reference(block, MASK)
    assert ids[2].tolist() == [3, 1, 0]           # MASK excluded; tie among the zeros -> lowest id
    assert MASK not in ids.ravel().tolist()
    assert (probs.sum(-1) <= 1.0 + 1e-6).all()
    assert _ref_row(block) == MismatchPrediction(2, 1)


def test_reference_eos_rank2_gives_rank3_correction():
    block = np.stack([
        _row((0, CONFIDENT)),
        _row((2, 1.0), (EOS, 0.95), (5, 0.9)),    # risky; rank-2 is EOS -> correction is rank-3
        _row((4, CONFIDENT)),
    ])
    ids, _ = topk_reference(block, MASK)
    assert ids[1].tolist() == [2, EOS, 5]
    assert _ref_row(block) == MismatchPrediction(1, 5)


def test_reference_no_flag_and_seed_position_ignored():
    block = np.stack([
        _row((0, 1.0), (1, 1.0), (2, 1.0)),       # position 0 as risky as it gets: ignored
        _row((4, CONFIDENT)),
        _row((EOS, CONFIDENT)),                   # confident EOS: not risky
        _row((3, CONFIDENT), (MASK, 50.0)),
    ])
    risk0 = 1.0 - np.subtract(*topk_reference(block, MASK)[1][0])
    assert risk0 > 0.5
    assert _ref_row(block) == MismatchPrediction(-1, -1)


def test_reference_ties_lowest_id_and_threshold():
    block = np.stack([_row((0, CONFIDENT)), _row((4, 3.0), (1, 3.0), (6, 3.0))])
    ids, probs = topk_reference(block, MASK)
    assert ids[1].tolist() == [1, 4, 6]
    assert probs[1, 0] == probs[1, 1]
    assert _ref_row(block) == MismatchPrediction(1, 4)
    # margin just above / below 1 - tau
    block2 = np.stack([_row((0, CONFIDENT)), _row((3, 4.0), (2, 1.0))])
    _, p = topk_reference(block2, MASK)
    risk = float(1.0 - (p[1, 0] - p[1, 1]))
    assert _ref_row(block2, tau=risk - 1e-3).position == 1
    assert _ref_row(block2, tau=risk + 1e-3).position == -1


def test_reference_drafted_override():
    block = np.stack([_row((0, CONFIDENT)), _row((3, 2.0), (1, 1.9), (EOS, 1.8))])
    # sampled drafting picked the rank-2 token: the correction is the rank-1 token
    assert _ref_row(block, drafted=np.array([0, 1])) == MismatchPrediction(1, 3)


# --------------------------------------------------------------------------------------------------
# Random cases shared by the emulation and GPU tests
# --------------------------------------------------------------------------------------------------

def make_case(rng: np.random.Generator, rows: int, length: int, vocab: int, mask_id: int, eos_id: int,
              dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """Random logits with exact ties, MASK/EOS top-ranked, near-uniform rows and ragged lengths."""
    x = rng.normal(0.0, 2.0, size=(rows, length, vocab))
    for r in range(rows):
        for i in range(length):
            kind = rng.integers(0, 6)
            top = x[r, i].max()
            if kind == 0:      # MASK is the arg-max (must be skipped)
                x[r, i, mask_id] = top + 5.0
            elif kind == 1:    # EOS is rank 2, close to rank 1
                a = int(rng.integers(0, vocab))
                if a not in (mask_id, eos_id):
                    x[r, i, a] = top + 1.0
                    x[r, i, eos_id] = top + 0.9
            elif kind == 2:    # exact 3-way tie at the top
                toks = rng.choice(vocab, size=3, replace=False)
                x[r, i, toks] = top + 1.0
            elif kind == 3:    # confident position
                x[r, i, int(rng.integers(0, vocab))] = top + 12.0
            elif kind == 4:    # EOS is the arg-max
                x[r, i, eos_id] = top + 0.3
    x = x.astype(dtype)
    lengths = rng.integers(0, length + 1, size=rows).astype(np.int32)
    lengths[0] = length
    if rows > 1:
        lengths[1] = min(1, length)
    return x, lengths


def check_against_reference(logits: np.ndarray, lengths: np.ndarray, mask_id: int, eos_id: int, tau: float,
                            top_ids: np.ndarray, top_probs: np.ndarray, flag_pos: np.ndarray,
                            correction: np.ndarray) -> None:
    rows, length, _ = logits.shape
    near_threshold = 0
    for r in range(rows):
        n = int(np.clip(lengths[r], 0, length))
        ref_ids, ref_probs = topk_reference(logits[r, :n], mask_id)
        np.testing.assert_array_equal(top_ids[r, :n], ref_ids, err_msg=f"row {r}")
        np.testing.assert_allclose(top_probs[r, :n], ref_probs, rtol=1e-4, atol=2e-6, err_msg=f"row {r}")
        assert (top_ids[r, n:] == -1).all() and (top_probs[r, n:] == 0).all(), f"row {r} padding"
        # the flag step is exact given the kernel's own top-k outputs ...
        own = predict_mismatch(top_ids[r, :n], top_probs[r, :n], tau, eos_id)
        assert (int(flag_pos[r]), int(correction[r])) == (own.position, own.correction), f"row {r}"
        # ... and agrees with the full reference unless a risk sits within float error of tau
        ref = predict_mismatch(ref_ids, ref_probs, tau, eos_id)
        if (own.position, own.correction) != (ref.position, ref.correction):
            risk = 1.0 - (ref_probs[:, 0].astype(np.float64) - ref_probs[:, 1])
            assert np.abs(risk[1:] - tau).min() < 1e-4, f"row {r}: {own} != {ref}"
            near_threshold += 1
    assert near_threshold <= max(1, rows // 10)


# --------------------------------------------------------------------------------------------------
# Compilation without a GPU
# --------------------------------------------------------------------------------------------------

def _nvrtc_available() -> str | None:
    """None when NVRTC works, else why not (bindings missing, or libnvrtc not found by them)."""
    try:
        nvrtc = plugin_lib._nvrtc_module()
        err, *_ = nvrtc.nvrtcVersion()
    except Exception as exc:
        return f"{exc} (pip install cuda-python nvidia-cuda-nvrtc)"
    return None if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else f"nvrtcVersion: {err}"


def test_source_is_found_and_self_contained():
    src = plugin_lib.kernel_source()
    device_part = src.split("#ifndef __CUDACC_RTC__")[0]
    assert "#include" not in device_part
    for name in plugin_lib.KERNEL_NAMES:
        assert f"{name}(" in src
    assert f"#define RG_BLOCK {plugin_lib.BLOCK_SIZE}" in src


@pytest.mark.skipif(_nvrtc_available() is not None, reason=f"NVRTC not usable: {_nvrtc_available()}")
def test_nvrtc_compiles_for_sm90():
    ptx = plugin_lib.compile_nvrtc("sm_90").decode()
    assert ".target sm_90" in ptx
    for name in plugin_lib.KERNEL_NAMES:
        assert f".entry {name}(" in ptx
    cubin = plugin_lib.compile_nvrtc("sm_90", output="cubin")
    assert cubin[:4] == b"\x7fELF"


def test_nvrtc_missing_gives_clear_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, globals=None, locals=None, fromlist=(), level=0):
        if name.startswith("cuda"):
            raise ImportError(f"no module {name}")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(RuntimeError, match="cuda-python"):
        plugin_lib.compile_nvrtc()


def _nvcc() -> str | None:
    try:
        return plugin_lib.find_nvcc()
    except RuntimeError:
        return None


@pytest.fixture(scope="module")
def nvcc_library(tmp_path_factory) -> Path:
    if _nvcc() is None:
        pytest.skip("nvcc not found")
    return plugin_lib.compile_nvcc(tmp_path_factory.mktemp("mismatch_lib"))


def test_nvcc_builds_shared_library_with_launcher(nvcc_library):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not found")
    out = subprocess.run([nm, "-D", "--defined-only", str(nvcc_library)], capture_output=True, text=True,
                         check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if " T " in line}
    assert plugin_lib.LAUNCHER_SYMBOL in exported
    assert "recguide_mismatch_block_size" in exported


def test_launcher_loads_and_reports_errors_without_gpu(nvcc_library):
    if _gpu_count() > 0:
        pytest.skip("a GPU is present: the error-path probe uses fake pointers")
    fn = plugin_lib.load_launcher(nvcc_library)
    assert fn(None, 0, None, 0, 4, 16, 0, 1, 0.5, None, None, None, None, None) == 0  # rows == 0: no-op
    assert fn(None, 2, None, 1, 4, 16, 0, 1, 0.5, None, None, None, None, None) != 0  # bad dtype
    # a launch without a driver/device returns a cudaError_t instead of crashing
    assert fn(16, 0, 16, 1, 1, 16, 0, 1, 0.5, 16, 16, 16, 16, None) != 0


# --------------------------------------------------------------------------------------------------
# Device code on the CPU (g++ + SIMT shim)
# --------------------------------------------------------------------------------------------------

EMULATION_SHIM = r"""
// Host emulation of the CUDA features mismatch_predict.cu uses. One std::thread per CUDA thread;
// __syncthreads is a block barrier and __shfl_down_sync exchanges through a slot array between two
// warp barriers. Only meant for uniform control flow around barriers, which the kernel has.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __CUDACC_RTC__ 1  // leave out the host launcher
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static

struct Dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local Dim3 threadIdx, blockIdx;
static Dim3 blockDim, gridDim;
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
#define __expf(x) std::exp(x)  // glibc declares its own __expf

static std::barrier<>* g_block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> g_warp_barriers;
static inline void __syncthreads() { g_block_barrier->arrive_and_wait(); }
template <class T> static T __shfl_down_sync(unsigned, T v, int offset)
{
    static T slots[1024];
    const unsigned t = threadIdx.x, lane = t % 32, warp = t / 32;
    slots[t] = v;
    g_warp_barriers[warp]->arrive_and_wait();
    T r = lane + offset < 32 ? slots[t + offset] : v;
    g_warp_barriers[warp]->arrive_and_wait();
    return r;
}

#include KERNEL_SOURCE

template <class F> static void launch(unsigned grid, unsigned block, F f)
{
    gridDim.x = grid;
    blockDim.x = block;
    for (unsigned b = 0; b < grid; ++b)
    {
        std::barrier<> bb(block);
        g_block_barrier = &bb;
        g_warp_barriers.clear();
        for (unsigned w = 0; w < (block + 31) / 32; ++w)
            g_warp_barriers.emplace_back(new std::barrier<>(32));
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < block; ++t)
            ts.emplace_back([&, t] { threadIdx.x = t; blockIdx.x = b; f(); });
        for (auto& th : ts)
            th.join();
    }
}

static void read_all(FILE* f, void* p, size_t n) { if (n && fread(p, 1, n, f) != n) { perror("read"); exit(2); } }

int main(int argc, char** argv)
{
    if (argc != 3) return 2;
    FILE* in = fopen(argv[1], "rb");
    int h[8];
    float tau;
    read_all(in, h, sizeof h);
    read_all(in, &tau, 4);
    const int rows = h[0], L = h[1], V = h[2], mask = h[3], eos = h[4], dtype = h[5], shift = h[6];
    std::vector<int> lengths(rows);
    read_all(in, lengths.data(), 4 * rows);
    const size_t es = dtype ? 2 : 4, n = (size_t) rows * L * V;
    std::vector<uint4> storage((n * es + 64) / 16 + 1);
    char* base = reinterpret_cast<char*>(storage.data()) + shift * es;  // shift: misalign the rows
    read_all(in, base, n * es);
    fclose(in);
    std::vector<int> ids((size_t) rows * L * 3, 12345), flag(rows, 12345), corr(rows, 12345);
    std::vector<float> probs((size_t) rows * L * 2, 12345.f);
    if (rows * L > 0)
    {
        if (dtype == 0)
            launch(rows * L, RG_BLOCK, [&] { recguide_mismatch_topk_f32(reinterpret_cast<const float*>(base),
                lengths.data(), rows, L, V, mask, ids.data(), probs.data()); });
        else
            launch(rows * L, RG_BLOCK, [&] { recguide_mismatch_topk_f16(
                reinterpret_cast<const unsigned short*>(base), lengths.data(), rows, L, V, mask, ids.data(),
                probs.data()); });
    }
    launch((rows + RG_FLAG_BLOCK - 1) / RG_FLAG_BLOCK, RG_FLAG_BLOCK, [&] { recguide_mismatch_flag(
        ids.data(), probs.data(), lengths.data(), rows, L, eos, tau, flag.data(), corr.data()); });
    FILE* out = fopen(argv[2], "wb");
    fwrite(ids.data(), 4, ids.size(), out);
    fwrite(probs.data(), 4, probs.size(), out);
    fwrite(flag.data(), 4, rows, out);
    fwrite(corr.data(), 4, rows, out);
    fclose(out);
    return 0;
}
"""


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Path:
    gxx = shutil.which("g++")
    if gxx is None or not sys.platform.startswith("linux"):
        pytest.skip("g++ not found (needed for the host emulation of the kernel)")
    d = tmp_path_factory.mktemp("mismatch_emu")
    (d / "emu.cpp").write_text(EMULATION_SHIM)
    exe = d / "emu"
    proc = subprocess.run(
        [gxx, "-std=c++20", "-O1", "-pthread", f'-DKERNEL_SOURCE="{plugin_lib.kernel_source_path()}"',
         "-o", str(exe), str(d / "emu.cpp")], capture_output=True, text=True)
    if proc.returncode != 0 and "barrier" in proc.stderr and "No such file" in proc.stderr:
        pytest.skip("g++ lacks C++20 <barrier>")
    assert proc.returncode == 0, proc.stderr
    return exe


def run_emulated(exe: Path, logits: np.ndarray, lengths: np.ndarray, mask_id: int, eos_id: int, tau: float,
                 shift: int = 0):
    rows, length, vocab = logits.shape
    dtype = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}[logits.dtype]
    d = exe.parent
    header = np.array([rows, length, vocab, mask_id, eos_id, dtype, shift, 0], np.int32)
    with open(d / "in.bin", "wb") as f:
        f.write(header.tobytes() + np.float32(tau).tobytes() + lengths.astype(np.int32).tobytes()
                + np.ascontiguousarray(logits).tobytes())
    subprocess.run([str(exe), str(d / "in.bin"), str(d / "out.bin")], check=True, timeout=300)
    raw = np.fromfile(d / "out.bin", dtype=np.int32)
    n = rows * length
    top_ids = raw[:3 * n].reshape(rows, length, 3)
    top_probs = raw[3 * n:5 * n].view(np.float32).reshape(rows, length, 2)
    flag_pos = raw[5 * n:5 * n + rows]
    correction = raw[5 * n + rows:]
    return top_ids, top_probs, flag_pos, correction


@pytest.mark.parametrize(
    ("dtype", "rows", "length", "vocab", "mask_id", "eos_id", "shift"),
    [
        (np.float32, 5, 4, 1000, 3, 999, 0),    # V % 4 == 0, aligned rows
        (np.float16, 5, 4, 1003, 1002, 0, 0),   # odd V: every row has its own head/tail split
        (np.float32, 3, 3, 577, 0, 5, 1),       # misaligned base pointer
        (np.float16, 2, 3, 7, 6, 5, 3),         # V smaller than one vector per thread
    ],
)
def test_kernel_emulated_on_cpu_matches_reference(emulator, dtype, rows, length, vocab, mask_id, eos_id, shift):
    rng = np.random.default_rng(rows * 1000 + vocab)
    logits, lengths = make_case(rng, rows, length, vocab, mask_id, eos_id, dtype)
    tau = 0.5
    outs = run_emulated(emulator, logits, lengths, mask_id, eos_id, tau, shift)
    check_against_reference(logits, lengths, mask_id, eos_id, tau, *outs)


def test_kernel_emulated_hand_built_cases(emulator):
    blocks = [
        [_row((0, 1.0), (1, 1.0)), _row((4, CONFIDENT)), _row((MASK, 20.0), (3, 2.0), (1, 1.9))],
        [_row((0, CONFIDENT)), _row((2, 1.0), (EOS, 0.95), (5, 0.9)), _row((4, CONFIDENT))],
        [_row((0, 1.0), (1, 1.0), (2, 1.0)), _row((4, CONFIDENT)), _row((EOS, CONFIDENT))],
        [_row((0, CONFIDENT)), _row((4, 3.0), (1, 3.0), (6, 3.0)), _row((0, 1.0), (1, 1.0))],
    ]
    logits = np.stack([np.stack(b) for b in blocks])
    lengths = np.array([3, 3, 3, 3], np.int32)
    _, _, flag_pos, correction = run_emulated(emulator, logits, lengths, MASK, EOS, 0.5)
    assert list(zip(flag_pos.tolist(), correction.tolist())) == [(2, 1), (1, 5), (-1, -1), (1, 4)]


# --------------------------------------------------------------------------------------------------
# The real kernel on a GPU
# --------------------------------------------------------------------------------------------------

def _gpu_count() -> int:
    """CUDA devices visible through cuda-python (0 when it is missing or no driver/device)."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # type: ignore[no-redef]
        except ImportError:
            return 0
    try:
        err, count = cudart.cudaGetDeviceCount()
    except Exception:
        return 0
    return int(count) if err == cudart.cudaError_t.cudaSuccess else 0


class _DeviceBuffers:
    """Minimal cudaMalloc/cudaMemcpy through cuda-python (no CUDA build of torch needed)."""

    def __init__(self):
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            from cuda import cudart  # type: ignore[no-redef]
        self.rt = cudart
        self.ptrs: list[int] = []

    def _ck(self, res):
        err, *rest = res
        assert err == self.rt.cudaError_t.cudaSuccess, err
        return rest[0] if rest else None

    def upload(self, arr: np.ndarray) -> int:
        arr = np.ascontiguousarray(arr)
        ptr = int(self._ck(self.rt.cudaMalloc(max(arr.nbytes, 1))))
        self.ptrs.append(ptr)
        if arr.nbytes:
            self._ck(self.rt.cudaMemcpy(ptr, arr.ctypes.data, arr.nbytes,
                                        self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice))
        return ptr

    def download(self, ptr: int, like: np.ndarray) -> np.ndarray:
        out = np.empty_like(like)
        if out.nbytes:
            self._ck(self.rt.cudaMemcpy(out.ctypes.data, ptr, out.nbytes,
                                        self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost))
        return out

    def synchronize(self) -> None:
        self._ck(self.rt.cudaDeviceSynchronize())

    def free(self) -> None:
        for p in self.ptrs:
            self.rt.cudaFree(p)
        self.ptrs.clear()


@pytest.mark.gpu
@pytest.mark.skipif(_gpu_count() == 0, reason="no CUDA GPU (cudaGetDeviceCount via cuda-python)")
@pytest.mark.parametrize(
    ("dtype", "rows", "length", "vocab", "mask_id", "eos_id"),
    [
        (np.float32, 16, 8, 4096, 4095, 2),
        (np.float16, 16, 8, 4099, 0, 4098),
        (np.float32, 7, 5, 151_936, 151_935, 151_643),
        (np.float16, 3, 33, 37, 36, 1),
    ],
)
def test_kernel_on_gpu_matches_reference(nvcc_library, dtype, rows, length, vocab, mask_id, eos_id):
    fn = plugin_lib.load_launcher(nvcc_library)
    rng = np.random.default_rng(vocab)
    logits, lengths = make_case(rng, rows, length, vocab, mask_id, eos_id, dtype)
    tau = 0.5
    bufs = _DeviceBuffers()
    try:
        host_out = (np.zeros((rows, length, 3), np.int32), np.zeros((rows, length, 2), np.float32),
                    np.zeros(rows, np.int32), np.zeros(rows, np.int32))
        d_in = bufs.upload(logits)
        d_len = bufs.upload(lengths)
        d_out = [bufs.upload(h) for h in host_out]
        err = fn(d_in, plugin_lib.DTYPE_F16 if dtype == np.float16 else plugin_lib.DTYPE_F32, d_len, rows, length,
                 vocab, mask_id, eos_id, tau, *d_out, None)
        assert err == 0
        bufs.synchronize()
        outs = [bufs.download(p, h) for p, h in zip(d_out, host_out)]
    finally:
        bufs.free()
    check_against_reference(logits, lengths, mask_id, eos_id, tau, *outs)
