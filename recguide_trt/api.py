"""The public Python API: ``LLM`` and ``SamplingParams`` (DESIGN.md §6)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .backends.base import Backend
from .backends.choice import BACKENDS, default_backend
from .model.checkpoint import load_checkpoint
from .runtime.engine import Engine, EngineConfig
from .runtime.handles import EngineLoop, RequestHandle
from .runtime.metrics import RequestMetrics
from .runtime.params import SamplingParams

EMBEDDED_MODEL = Path(__file__).resolve().parent / "assets" / "nld-tiny"


@dataclass
class RequestOutput:
    """The result of one prompt."""

    request_id: int
    """Engine request id."""
    prompt: str | list[int]
    """As given."""
    text: str
    """Decoded output (special tokens skipped)."""
    token_ids: list[int]
    """Output token ids."""
    finish_reason: str | None
    """"length", "eos", "cancelled" or "error"."""
    metrics: RequestMetrics
    """MAL, TPF, forward counts, timings (DESIGN.md §5)."""
    error: str | None = None
    """Why the request failed, when it did."""


def resolve_model_path(model: str | Path | None) -> Path:
    if model is None or model == "default":
        if not (EMBEDDED_MODEL / "config.json").is_file():
            raise FileNotFoundError(f"the embedded model is missing at {EMBEDDED_MODEL}; reinstall the package "
                                    f"or pass model=<checkpoint dir>")
        return EMBEDDED_MODEL
    return Path(model)


def make_backend(name: str, ckpt, device: str, slots: int, capacity: int, model_path: Path, **kwargs) -> Backend:
    if name == "torch":
        from .backends.torch_backend import TorchBackend

        return TorchBackend(ckpt.model.to(device), slots, capacity, device)
    if name == "native":
        from .backends.native_backend import NativeBackend

        if device != "cpu":
            raise ValueError(f"the native backend runs on the CPU; for device={device!r} use backend='torch'")
        return NativeBackend(ckpt.model, slots, capacity)
    if name == "onnxruntime":
        from .backends.onnxruntime_backend import OnnxRuntimeBackend

        return OnnxRuntimeBackend.from_checkpoint(model_path, max_slots=slots, slot_capacity=capacity, **kwargs)
    if name == "tensorrt":
        from .backends.tensorrt_backend import TensorRTBackend

        return TensorRTBackend.from_checkpoint(model_path, max_slots=slots, slot_capacity=capacity, **kwargs)
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


class LLM:
    """Load a checkpoint (default: the embedded tiny NLD model) and generate with any policy."""

    def __init__(self, model: str | Path | None = None, backend: str | None = None, device: str = "cpu",
                 dtype: str | None = None, max_num_seqs: int = 64, max_model_len: int | None = None,
                 engine_config: EngineConfig | None = None, **backend_kwargs):
        if backend is not None and backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        if device not in ("cpu", "cuda") and not str(device).startswith("cuda:"):
            raise ValueError(f"unknown device {device!r}; use 'cpu' or 'cuda'")
        if backend is None:
            backend = default_backend(device, dtype)
        self.backend_name = backend
        """The backend this LLM runs on (``backend=None`` picks :func:`~.backends.choice.default_backend`)."""
        path = resolve_model_path(model)
        self.checkpoint = load_checkpoint(path, dtype=dtype)
        self.config = self.checkpoint.config
        self.tokenizer = self.checkpoint.tokenizer
        ec = engine_config or EngineConfig(max_num_seqs=max_num_seqs)
        if max_model_len is not None:
            ec.max_model_len = max_model_len
        ec.max_model_len = min(ec.max_model_len, self.config.max_position_embeddings)
        max_block = ec.max_block_size or min(32, 2 * self.config.block_size)
        capacity = ec.max_model_len + 2 * max_block
        if backend == "onnxruntime":
            # The export's profiles must cover what this engine sends: blocks up to max_block, fused
            # rows of 2·max_block, max_num_seqs rows.
            backend_kwargs.setdefault("export_kwargs", {"max_block": max_block, "max_model_len": capacity,
                                                        "max_batch": max(64, ec.max_num_seqs)})
        self.backend = make_backend(backend, self.checkpoint, device, ec.max_num_seqs, capacity, path,
                                    **backend_kwargs)
        import torch

        cost_key = {"model": self.config.fingerprint(), "backend": backend, "device": device,
                    "dtype": str(dtype), "threads": torch.get_num_threads()}
        self.engine = Engine(self.backend, self.config, ec, cost_key)
        self._loop: EngineLoop | None = None

    # -- helpers ---------------------------------------------------------------------------
    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this checkpoint has no tokenizer.json: pass prompts as lists of token ids")
            if not prompt:
                raise ValueError("prompt is empty: give at least one character of text")
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)):
            return list(prompt)
        raise ValueError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else ""

    # -- batch generation --------------------------------------------------------------------
    def generate(self, prompts: str | list[str] | list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Generate for every prompt (continuous batching); outputs in prompt order."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
            raise ValueError("prompts is empty: pass at least one prompt")
        params = params or SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"got {len(plist)} SamplingParams for {len(prompts)} prompts")
        encoded = [self.encode(p) for p in prompts]
        for ids, p in zip(encoded, plist):
            self.engine.check(ids, p)
        if self._loop is not None:
            handles = [self._loop.submit(ids, p) for ids, p in zip(encoded, plist)]
            reqs = [h.result() for h in handles]
        else:
            reqs = [self.engine.submit(ids, p) for ids, p in zip(encoded, plist)]
            self.engine.run_until_done()
        return [RequestOutput(r.id, prompt, self.decode(r.output_ids), list(r.output_ids), r.finish_reason,
                              r.metrics, r.error) for prompt, r in zip(prompts, reqs)]

    # -- serving: background loop, streaming handles -----------------------------------------
    def submit(self, prompt: str | list[int], params: SamplingParams | None = None) -> RequestHandle:
        """Submit one request to the background loop (started on first use); returns a streaming handle."""
        if self._loop is None:
            self._loop = EngineLoop(self.engine)
        return self._loop.submit(self.encode(prompt), params or SamplingParams())

    def cancel(self, handle: RequestHandle) -> None:
        handle.cancel()

    def shutdown(self) -> None:
        if self._loop is not None:
            self._loop.shutdown()
            self._loop = None
