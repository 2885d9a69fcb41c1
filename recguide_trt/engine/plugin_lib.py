"""Build and load the fused mismatch-prediction kernel (plugins/mismatch_predict.cu).

Three ways to get machine code out of the one source file:

* :func:`compile_nvrtc` - PTX or cubin through NVRTC (``cuda-python`` + ``nvidia-cuda-nvrtc``);
  works without a GPU, which is how CI checks that the kernel source compiles.
* :func:`compile_nvcc` - the shared library ``librecguide_mismatch.so`` (kernels + the C launcher
  ``recguide_mismatch_predict``) through ``nvcc``.
* ``plugins/CMakeLists.txt`` - the same library plus the TensorRT plugin (``librecguide_plugins.so``).

:func:`load_launcher` opens the shared library with ctypes; :func:`predict_mismatch_cuda` runs it on
torch CUDA tensors (GPU machines only). Semantics: ``recguide_trt.runtime.mismatch``.
All heavy imports (cuda-python, torch) are lazy.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

SOURCE_ENV = "RECGUIDE_PLUGIN_SRC"
"""Environment variable overriding the location of ``mismatch_predict.cu``."""

LIBRARY_NAME = "librecguide_mismatch.so"
LAUNCHER_SYMBOL = "recguide_mismatch_predict"
KERNEL_NAMES = ("recguide_mismatch_topk_f32", "recguide_mismatch_topk_f16", "recguide_mismatch_flag")
"""``extern "C"`` kernels in the source (unmangled names in PTX/cubin)."""
BLOCK_SIZE = 256
"""Threads per block of the top-k kernels (``RG_BLOCK`` in the source)."""
FLAG_BLOCK_SIZE = 128

DTYPE_F32 = 0
DTYPE_F16 = 1


def kernel_source_path() -> Path:
    """Path of ``plugins/mismatch_predict.cu`` (``$RECGUIDE_PLUGIN_SRC`` overrides it)."""
    env = os.environ.get(SOURCE_ENV)
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "plugins" / "mismatch_predict.cu"
    if not path.is_file():
        raise RuntimeError(
            f"mismatch kernel source not found at {path}; run from a source checkout of recguide-trt "
            f"or point ${SOURCE_ENV} at plugins/mismatch_predict.cu"
        )
    return path


def kernel_source() -> str:
    return kernel_source_path().read_text()


def _nvrtc_module() -> Any:
    try:
        from cuda.bindings import nvrtc  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import nvrtc  # type: ignore[no-redef]  # older cuda-python
        except ImportError as exc:
            raise RuntimeError(
                "NVRTC bindings are not available: install `cuda-python` and `nvidia-cuda-nvrtc` "
                "(pip install cuda-python nvidia-cuda-nvrtc)"
            ) from exc
    return nvrtc


def _nvrtc_check(nvrtc: Any, result: Any, what: str, prog: Any = None) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        log = _nvrtc_log(nvrtc, prog) if prog is not None else ""
        raise RuntimeError(f"NVRTC {what} failed: {err}" + (f"\n{log}" if log else ""))
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


def _nvrtc_log(nvrtc: Any, prog: Any) -> str:
    try:
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
            return ""
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        return buf.rstrip(b"\x00").decode(errors="replace").strip()
    except Exception:  # the log is best effort
        return ""


def compile_nvrtc(arch: str = "sm_90", output: str = "ptx", options: tuple[str, ...] = ()) -> bytes:
    """Compile the kernel source with NVRTC (no GPU needed) and return PTX (default) or a cubin.

    ``arch`` is ``sm_XX`` (PTX or cubin) or ``compute_XX`` (PTX only). The PTX contains the
    ``extern "C"`` entries of :data:`KERNEL_NAMES`. Raises ``RuntimeError`` with the compiler log on
    failure and when cuda-python / the NVRTC library is missing.
    """
    if output not in ("ptx", "cubin"):
        raise ValueError(f"output must be 'ptx' or 'cubin', not {output!r}")
    if output == "cubin" and not arch.startswith("sm_"):
        raise ValueError("a cubin needs a real architecture (sm_XX)")
    nvrtc = _nvrtc_module()
    src = kernel_source().encode()
    try:
        result = nvrtc.nvrtcCreateProgram(src, b"mismatch_predict.cu", 0, [], [])
    except Exception as exc:  # e.g. libnvrtc.so not found by the bindings
        raise RuntimeError(
            f"NVRTC is not usable ({exc}); install `nvidia-cuda-nvrtc` matching cuda-python's major version"
        ) from exc
    prog = _nvrtc_check(nvrtc, result, "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", b"-default-device"]
        opts += [o.encode() for o in options]
        _nvrtc_check(nvrtc, nvrtc.nvrtcCompileProgram(prog, len(opts), opts), "compilation", prog)
        if output == "ptx":
            size = _nvrtc_check(nvrtc, nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
            buf = b" " * size
            _nvrtc_check(nvrtc, nvrtc.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
        else:
            size = _nvrtc_check(nvrtc, nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            buf = b" " * size
            _nvrtc_check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return buf.rstrip(b"\x00") if output == "ptx" else buf


def find_nvcc() -> str:
    """``nvcc`` from ``$CUDACXX``, ``PATH``, ``$CUDA_HOME/bin`` or /usr/local/cuda/bin."""
    candidates = [os.environ.get("CUDACXX"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(str(Path(home) / "bin" / "nvcc"))
    for cand in candidates:
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    raise RuntimeError("nvcc not found (looked at $CUDACXX, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin); "
                       "install the CUDA toolkit or use compile_nvrtc()")


def compile_nvcc(out_dir: str | os.PathLike[str], arch: str = "sm_90", extra_flags: tuple[str, ...] = (),
                 timeout: float = 600.0) -> Path:
    """Build ``librecguide_mismatch.so`` (kernels + C launcher) into ``out_dir`` with nvcc."""
    nvcc = find_nvcc()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lib = out / LIBRARY_NAME
    cmd = [nvcc, "-O3", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC", "-o", str(lib),
           str(kernel_source_path()), *extra_flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    return lib


def load_launcher(lib_path: str | os.PathLike[str]) -> Any:
    """Open the shared library and return its ``recguide_mismatch_predict`` with ctypes signatures.

    Call as ``fn(logits_ptr, dtype, lengths_ptr, rows, L, V, mask_id, eos_id, tau, top_ids_ptr,
    top_probs_ptr, flag_pos_ptr, correction_ptr, stream_ptr)``; it returns a ``cudaError_t`` (0 = ok).
    Loading needs the CUDA runtime (libcudart) to be resolvable; launching needs a GPU.
    """
    try:
        lib = ctypes.CDLL(str(lib_path))
    except OSError as exc:
        raise RuntimeError(f"cannot load {lib_path}: {exc}") from exc
    fn = getattr(lib, LAUNCHER_SYMBOL)
    vp, i32 = ctypes.c_void_p, ctypes.c_int
    fn.argtypes = [vp, i32, vp, i32, i32, i32, i32, i32, ctypes.c_float, vp, vp, vp, vp, vp]
    fn.restype = i32
    fn.lib = lib  # keep the library alive as long as the function
    return fn


def predict_mismatch_cuda(fn: Any, logits: Any, lengths: Any, mask_token_id: int, eos_token_id: int,
                          tau: float, stream: Any = None) -> tuple[Any, Any, Any, Any]:
    """Run the launcher on torch CUDA tensors; returns ``(top_ids, top_probs, flag_pos, correction)``.

    ``logits``: ``[rows, L, V]`` float32/float16 on CUDA; ``lengths``: ``[rows]`` (any int dtype).
    Positions at/after a row's length get top_ids -1 and top_probs 0. Runs on ``stream`` (a
    ``torch.cuda.Stream``; default: the current stream) and does not synchronise.
    """
    import torch

    if logits.dim() != 3 or not logits.is_cuda:
        raise ValueError("logits must be a [rows, L, V] CUDA tensor")
    if logits.dtype == torch.float32:
        dtype = DTYPE_F32
    elif logits.dtype == torch.float16:
        dtype = DTYPE_F16
    else:
        raise ValueError(f"logits dtype {logits.dtype} not supported (float32/float16)")
    logits = logits.contiguous()
    rows, length, vocab = logits.shape
    dev = logits.device
    lengths = lengths.to(device=dev, dtype=torch.int32).contiguous()
    top_ids = torch.empty(rows, length, 3, dtype=torch.int32, device=dev)
    top_probs = torch.empty(rows, length, 2, dtype=torch.float32, device=dev)
    flag_pos = torch.empty(rows, dtype=torch.int32, device=dev)
    correction = torch.empty(rows, dtype=torch.int32, device=dev)
    s = stream if stream is not None else torch.cuda.current_stream(dev)
    err = fn(logits.data_ptr(), dtype, lengths.data_ptr(), rows, length, vocab, int(mask_token_id),
             int(eos_token_id), float(tau), top_ids.data_ptr(), top_probs.data_ptr(), flag_pos.data_ptr(),
             correction.data_ptr(), s.cuda_stream)
    if err != 0:
        raise RuntimeError(f"{LAUNCHER_SYMBOL} returned cudaError_t {err}")
    return top_ids, top_probs, flag_pos, correction
