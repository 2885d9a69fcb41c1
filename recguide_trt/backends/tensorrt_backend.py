"""TensorRT backend: the engine of ``python -m recguide_trt.engine.build``, KV cache on the device.

Same protocol as :class:`~recguide_trt.backends.torch_backend.TorchBackend`. The engine has one
optimization profile per manifest profile (draft / verify / prefill, index map in
``engine.json``); a batch runs under ``manifest.select_profile`` and an execution context bound
to that profile. Contexts are created lazily per (profile, stream), so the verify and the
prospective draft of ``overlap="streams"`` never share a context.

Memory (all through cuda-python, ``cuda.bindings.runtime``): per layer a K and a V cache
``[max_slots, n_kv, capacity, head_dim]``; per stream growable staging buffers for the engine's
dense ``past_*`` inputs (gathered from the cache with ``cudaMemcpy2DAsync``), its ``present_*``
outputs (scattered back into the cache when ``write_kv``) and the small inputs/outputs.
``launch(batch, stream)`` enqueues everything on ``stream`` (default: the backend's own) and
returns a pending handle; ``collect`` copies the small outputs to the host and synchronises that
stream. One outstanding launch per stream.

The mismatch threshold ``tau`` is baked into the engine's plugin at build time (``engine.json``).
Nothing here touches TensorRT or CUDA at import time; the constructor checks for a GPU with
``cudaGetDeviceCount`` before creating any TensorRT object (they crash at teardown without one).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .base import TOPK, ForwardBatch, ForwardOutput

ENGINE_DIR_ENV = "RECGUIDE_ENGINE_DIR"
"""Directory holding engine directories (searched before build/engines/)."""
SMALL_OUTPUTS = ("argmax_ids", "top_ids", "top_probs", "flag_pos", "correction")
NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32, "bool": np.bool_}


def _cudart() -> Any:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:  # older cuda-python
        from cuda import cudart  # type: ignore[no-redef]
    return cudart


def gpu_count() -> int:
    """Visible CUDA devices via cuda-python (0 without cuda-python, driver or GPU; never raises)."""
    try:
        rt = _cudart()
        err, n = rt.cudaGetDeviceCount()
        return int(n) if err == rt.cudaError_t.cudaSuccess else 0
    except Exception:
        return 0


def _ck(rt: Any, result: Any, what: str) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != rt.cudaError_t.cudaSuccess:
        raise RuntimeError(f"{what} failed: {err}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


def _handle(stream: Any) -> int:
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    try:
        return int(stream)
    except TypeError:
        return int(stream.getPtr())


# ------------------------------------------------------------------------------------------------
# Finding an engine
# ------------------------------------------------------------------------------------------------
def engine_search_roots(extra: str | Path | None = None) -> list[Path]:
    from ..engine.build import DEFAULT_OUT_ROOT

    roots = [Path(extra)] if extra else []
    if os.environ.get(ENGINE_DIR_ENV):
        roots.append(Path(os.environ[ENGINE_DIR_ENV]))
    roots += [DEFAULT_OUT_ROOT, Path.cwd() / "build" / "engines"]
    out: list[Path] = []
    for r in roots:
        if r not in out:
            out.append(r)
    return out


def build_command_hint(checkpoint: str | Path) -> str:
    return (f"bash build/build_engine.sh --model {checkpoint}  (or: recguide export --model {checkpoint} --out DIR "
            f"&& python -m recguide_trt.engine.build --onnx-dir DIR)")


def find_engine_dir(checkpoint: str | Path, engines_root: str | Path | None = None,
                    precision: str | None = None) -> Path:
    """The newest engine directory built from ``checkpoint`` (same config fingerprint and weights key).

    ``checkpoint`` may itself be an engine directory (``model.engine`` + ``manifest.json``).
    Raises FileNotFoundError naming the command that builds one.
    """
    from ..engine.build import ENGINE_FILE, ENGINE_INFO
    from ..engine.manifest import MANIFEST_NAME, ExportManifest

    path = Path(checkpoint)
    if (path / ENGINE_FILE).is_file() and (path / MANIFEST_NAME).is_file():
        return path
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: neither a TensorRT engine directory ({ENGINE_FILE}) nor a checkpoint "
                                "(config.json)")
    from ..engine.export import weights_key
    from ..model.config import NLDConfig

    fp = NLDConfig.from_json(path / "config.json").fingerprint()
    wkey = weights_key(path)
    roots = engine_search_roots(engines_root)
    found: list[Path] = []
    stale: list[Path] = []
    for root in roots:
        if not root.is_dir():
            continue
        for d in sorted(p for p in root.iterdir() if (p / ENGINE_FILE).is_file() and (p / MANIFEST_NAME).is_file()):
            try:
                man = ExportManifest.load(d)
            except (ValueError, FileNotFoundError):
                continue
            if man.config_fingerprint != fp:
                continue
            if precision is not None and (d / ENGINE_INFO).is_file():
                if json.loads((d / ENGINE_INFO).read_text()).get("precision") != precision:
                    continue
            (found if man.weights_key == wkey else stale).append(d)
    if found:
        return max(found, key=lambda d: (d / ENGINE_FILE).stat().st_mtime)
    where = ", ".join(str(r) for r in roots)
    extra = (f"; engines for the same config but other weight files exist ({', '.join(map(str, stale))}), "
             "rebuild them") if stale else ""
    raise FileNotFoundError(f"no TensorRT engine built for {path} (looked in {where}{extra}); build one with: "
                            f"{build_command_hint(path)}")


# ------------------------------------------------------------------------------------------------
# Device memory
# ------------------------------------------------------------------------------------------------
class _DeviceBuffer:
    """A growable device allocation."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.ptr = 0
        self.nbytes = 0

    def ensure(self, nbytes: int) -> int:
        nbytes = max(int(nbytes), 1)
        if nbytes > self.nbytes:
            self.free()
            self.ptr = int(_ck(self.rt, self.rt.cudaMalloc(nbytes), f"cudaMalloc({nbytes})"))
            self.nbytes = nbytes
        return self.ptr

    def free(self) -> None:
        if self.ptr:
            self.rt.cudaFree(self.ptr)
        self.ptr, self.nbytes = 0, 0


@dataclass
class _Lane:
    """Per-stream state: contexts (by profile) and staging buffers (by tensor name)."""

    stream: Any
    contexts: dict[str, Any] = field(default_factory=dict)
    buffers: dict[str, _DeviceBuffer] = field(default_factory=dict)
    busy: bool = False


@dataclass
class _Pending:
    lane: _Lane
    batch_shape: tuple[int, int]
    out_shapes: dict[str, tuple[int, ...]]
    want_logits: bool
    keep: list[Any]
    """Host arrays referenced by enqueued copies."""


class TensorRTBackend:
    """Runs a TensorRT engine on packed batches (see the module docstring)."""

    name = "tensorrt"

    def __init__(self, engine_dir: str | Path, max_slots: int, slot_capacity: int, device: int | str = 0,
                 plugin_lib: str | None = None, **_ignored: Any):
        from ..engine.build import (
            ENGINE_FILE,
            ENGINE_INFO,
            find_plugin_library,
            import_tensorrt,
            load_plugins,
        )
        from ..engine.manifest import ExportManifest

        self.engine_dir = Path(engine_dir)
        self.manifest = ExportManifest.load(self.engine_dir)
        info_path = self.engine_dir / ENGINE_INFO
        self.info = json.loads(info_path.read_text()) if info_path.is_file() else {}
        n = gpu_count()
        if n == 0:
            raise RuntimeError("the TensorRT backend needs an NVIDIA GPU: cudaGetDeviceCount (cuda-python) reports "
                               "none; use backend='onnxruntime' or 'torch' on this machine")
        trt = import_tensorrt()
        self.trt = trt
        self.rt = rt = _cudart()
        dev = int(str(device).split(":")[-1]) if str(device) not in ("cuda", "") else 0
        _ck(rt, rt.cudaSetDevice(dev), "cudaSetDevice")
        man = self.manifest
        self.max_slots, self.slot_capacity = int(max_slots), int(slot_capacity)
        if self.slot_capacity > man.max_model_len + 2 * max(man.block_sizes):
            raise ValueError(f"slot capacity {slot_capacity} exceeds what the engine's profiles serve "
                             f"(max_model_len {man.max_model_len})")
        self.vocab_size = man.vocab_size
        self.mask_token_id = man.mask_token_id
        self.eos_token_id = man.eos_token_id
        self.tau = float(self.info.get("tau", 0.5))
        self.logger = trt.Logger(trt.Logger.WARNING)
        lib = None
        if self.info.get("plugin", True):
            lib = find_plugin_library(plugin_lib or self.info.get("plugin_lib"))
        self._plugin_handle = load_plugins(trt, self.logger, lib)
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine((self.engine_dir / ENGINE_FILE).read_bytes())
        if self.engine is None:
            raise RuntimeError(f"{self.engine_dir / ENGINE_FILE}: deserialisation failed (TensorRT version or GPU "
                               f"differs from the build: {self.info.get('tensorrt', '?')}); rebuild the engine")
        self.io_names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [t for t in self.io_names if self.engine.get_tensor_mode(t) == trt.TensorIOMode.INPUT]
        self.outputs = [t for t in self.io_names if t not in self.inputs]
        self.dtypes = {t: np.dtype(trt.nptype(self.engine.get_tensor_dtype(t))) for t in self.io_names}
        self.profile_index = dict(self.info.get("profiles") or {p: i for i, p in enumerate(
            [p for p in ("draft", "verify", "prefill") if p in man.profiles])})
        kv_dtype = self.dtypes.get("past_key_0", np.dtype(np.float32))
        self.kv_itemsize = kv_dtype.itemsize
        self.row_bytes = man.head_dim * self.kv_itemsize
        slot_bytes = man.num_kv_heads * self.slot_capacity * self.row_bytes
        self.k_cache = [_DeviceBuffer(rt) for _ in range(man.num_layers)]
        self.v_cache = [_DeviceBuffer(rt) for _ in range(man.num_layers)]
        for buf in self.k_cache + self.v_cache:
            buf.ensure(self.max_slots * slot_bytes)
            # Zero once: masked cache positions are still multiplied (by 0) in attention; NaN garbage would leak.
            _ck(rt, rt.cudaMemset(buf.ptr, 0, buf.nbytes), "cudaMemset")
        self.slot_bytes = slot_bytes
        self.stream = _ck(rt, rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "cudaStreamCreateWithFlags")
        self._lanes: dict[int, _Lane] = {}
        self.last_profile: str | None = None
        self.last_outputs: dict[str, np.ndarray] = {}

    # --------------------------------------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, path: str | Path, max_slots: int, slot_capacity: int,
                        engines_root: str | Path | None = None, precision: str | None = None,
                        **kw: Any) -> TensorRTBackend:
        """The engine built for checkpoint ``path`` (or ``path`` is an engine directory).

        FileNotFoundError (naming the build command) when none was built.
        """
        return cls(find_engine_dir(path, engines_root, precision), max_slots, slot_capacity, **kw)

    # --------------------------------------------------------------------------------------------
    def check(self, batch: ForwardBatch) -> str:
        B, T = batch.input_ids.shape
        P = batch.validate(self.max_slots, self.slot_capacity, self.vocab_size)
        return self.manifest.select_profile((B, T), P)

    def _lane(self, stream: Any) -> _Lane:
        key = _handle(stream)
        if key not in self._lanes:
            self._lanes[key] = _Lane(stream)
        return self._lanes[key]

    def _context(self, lane: _Lane, profile: str) -> Any:
        if profile not in lane.contexts:
            ctx = self.engine.create_execution_context()
            if ctx is None:
                raise RuntimeError("could not create a TensorRT execution context (device memory?)")
            idx = int(self.profile_index[profile])
            if not ctx.set_optimization_profile_async(idx, _handle(lane.stream)):
                raise RuntimeError(f"set_optimization_profile_async({idx}) failed")
            _ck(self.rt, self.rt.cudaStreamSynchronize(lane.stream), "cudaStreamSynchronize")
            lane.contexts[profile] = ctx
        return lane.contexts[profile]

    def _buf(self, lane: _Lane, name: str, nbytes: int) -> int:
        if name not in lane.buffers:
            lane.buffers[name] = _DeviceBuffer(self.rt)
        return lane.buffers[name].ensure(nbytes)

    def _h2d(self, dst: int, arr: np.ndarray, stream: Any) -> None:
        rt = self.rt
        if arr.nbytes:
            _ck(rt, rt.cudaMemcpyAsync(dst, arr.ctypes.data, arr.nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice,
                                       stream), "cudaMemcpyAsync(H2D)")

    def _copy2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int, stream: Any) -> None:
        rt = self.rt
        if width and height:
            _ck(rt, rt.cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height,
                                         rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice, stream), "cudaMemcpy2DAsync")

    # --------------------------------------------------------------------------------------------
    def forward(self, batch: ForwardBatch) -> ForwardOutput:
        return self.collect(self.launch(batch))

    def launch(self, batch: ForwardBatch, stream: Any = None) -> _Pending:
        profile = self.check(batch)
        stream = self.stream if stream is None else stream
        lane = self._lane(stream)
        if lane.busy:
            raise RuntimeError("a launched forward on this stream was not collected yet")
        ctx = self._context(lane, profile)
        man = self.manifest
        B, T = batch.input_ids.shape
        past_lens = np.asarray(batch.past_lens, np.int64)
        slots = np.asarray(batch.slots, np.int64)
        P = int(past_lens.max(initial=0))
        past_valid = np.arange(P)[None, :] < past_lens[:, None]
        mask = np.concatenate([np.broadcast_to(past_valid[:, None, :], (B, T, P)),
                               np.asarray(batch.intra_mask, bool)], axis=-1)
        host = {
            "input_ids": batch.input_ids, "position_ids": batch.position_ids, "attention_mask": mask,
            "draft_gate": batch.draft_gate, "mismatch_tau": np.array([self.tau], np.float32),
        }
        keep: list[Any] = []
        for name in self.inputs:
            if name.startswith("past_"):
                shape: tuple[int, ...] = (B, man.num_kv_heads, P, man.head_dim)
            else:
                arr = np.ascontiguousarray(host[name], dtype=self.dtypes[name])
                keep.append(arr)
                shape = arr.shape
            if not ctx.set_input_shape(name, shape):
                raise RuntimeError(f"set_input_shape({name}, {shape}) rejected under profile {profile!r}")
            nbytes = int(np.prod(shape)) * self.dtypes[name].itemsize
            ptr = self._buf(lane, name, nbytes)
            ctx.set_tensor_address(name, ptr)
            if name.startswith("past_"):
                layer = int(name.rsplit("_", 1)[1])
                cache = (self.k_cache if name.startswith("past_key") else self.v_cache)[layer]
                # gather cache[slot_b, :, :P] -> past[b] (n_kv rows of P * hd elements)
                for b in range(B):
                    self._copy2d(ptr + b * man.num_kv_heads * P * self.row_bytes, P * self.row_bytes,
                                 cache.ptr + int(slots[b]) * self.slot_bytes, self.slot_capacity * self.row_bytes,
                                 P * self.row_bytes, man.num_kv_heads, stream)
            else:
                self._h2d(ptr, keep[-1], stream)
        out_shapes: dict[str, tuple[int, ...]] = {}
        for name in self.outputs:
            shape = tuple(int(d) for d in ctx.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise RuntimeError(f"output {name} has unresolved shape {shape}")
            out_shapes[name] = shape
            ctx.set_tensor_address(name, self._buf(lane, name, int(np.prod(shape)) * self.dtypes[name].itemsize))
        if not ctx.execute_async_v3(_handle(stream)):
            raise RuntimeError("execute_async_v3 failed")
        if batch.write_kv:
            # scatter present[b] -> cache[slot_b, :, past_b:past_b+T]; reverse order: the first row wins
            for layer in range(man.num_layers):
                for kind, caches in (("key", self.k_cache), ("value", self.v_cache)):
                    src = lane.buffers[f"present_{kind}_{layer}"].ptr
                    for b in range(B - 1, -1, -1):
                        self._copy2d(caches[layer].ptr + int(slots[b]) * self.slot_bytes
                                     + int(past_lens[b]) * self.row_bytes, self.slot_capacity * self.row_bytes,
                                     src + b * man.num_kv_heads * T * self.row_bytes, T * self.row_bytes,
                                     T * self.row_bytes, man.num_kv_heads, stream)
        lane.busy = True
        self.last_profile = profile
        return _Pending(lane, (B, T), out_shapes, bool(np.any(batch.want_logits)), keep)

    def collect(self, pending: _Pending) -> ForwardOutput:
        rt = self.rt
        lane = pending.lane
        try:
            names = [n for n in SMALL_OUTPUTS if n in pending.out_shapes]
            if pending.want_logits:
                names.append("logits")
            host: dict[str, np.ndarray] = {}
            for name in names:
                arr = np.empty(pending.out_shapes[name], self.dtypes[name])
                if arr.nbytes:
                    _ck(rt, rt.cudaMemcpyAsync(arr.ctypes.data, lane.buffers[name].ptr, arr.nbytes,
                                               rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, lane.stream),
                        "cudaMemcpyAsync(D2H)")
                host[name] = arr
            _ck(rt, rt.cudaStreamSynchronize(lane.stream), "cudaStreamSynchronize")
        finally:
            lane.busy = False
        self.last_outputs = {k: host[k] for k in ("flag_pos", "correction") if k in host}
        B, T = pending.batch_shape
        return ForwardOutput(
            argmax=host["argmax_ids"].astype(np.int64, copy=False).reshape(B, T),
            top_ids=host["top_ids"].astype(np.int64, copy=False).reshape(B, T, TOPK),
            top_probs=host["top_probs"].astype(np.float32, copy=False).reshape(B, T, 2),
            logits=host["logits"].astype(np.float32, copy=False) if pending.want_logits else None)

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        n_kv = self.manifest.num_kv_heads
        for buf in self.k_cache + self.v_cache:
            self._copy2d(buf.ptr + dst * self.slot_bytes, self.slot_capacity * self.row_bytes,
                         buf.ptr + src * self.slot_bytes, self.slot_capacity * self.row_bytes,
                         int(length) * self.row_bytes, n_kv, self.stream)
        _ck(self.rt, self.rt.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def close(self) -> None:
        """Free device memory and destroy the stream (contexts before the engine)."""
        if getattr(self, "_lanes", None) is None:
            return
        self.rt.cudaDeviceSynchronize()
        for lane in self._lanes.values():
            lane.contexts.clear()
            for buf in lane.buffers.values():
                buf.free()
        self._lanes = {}
        for buf in self.k_cache + self.v_cache:
            buf.free()
        self.engine = None
        self.runtime = None
        self.rt.cudaStreamDestroy(self.stream)
        self._lanes = None  # type: ignore[assignment]
