"""The public Python API: ``LLM`` and ``SamplingParams`` (DESIGN.md §6)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .backends.base import Backend
from .backends.choice import BACKENDS, check_native_dtypes, check_native_dtypes_backend, default_backend
from .model.chat_template import check_template_kwargs, load_chat_template
from .model.checkpoint import Checkpoint, load_checkpoint, stored_dtype
from .model.draft_sampler import DraftSampler
from .models import resolve_model
from .runtime.engine import Engine, EngineConfig
from .runtime.handles import EngineLoop, RequestHandle
from .runtime.logprobs import TokenLogprob
from .runtime.metrics import RequestMetrics
from .runtime.params import SamplingParams
from .text_stream import TextStream


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
    """"length", "eos", "stop" (a ``stop_token_ids`` token), "cancelled" or "error"."""
    metrics: RequestMetrics
    """MAL, TPF, forward counts, timings (DESIGN.md §5)."""
    error: str | None = None
    """Why the request failed, when it did."""
    logprobs: list[TokenLogprob] | None = None
    """One per output token when ``SamplingParams.logprobs`` was set: its log-probability and the most likely
    alternatives at its position (:class:`~recguide_trt.runtime.logprobs.TokenLogprob`)."""
    prompt_logprobs: list[TokenLogprob] | None = None
    """One per prompt token after the first when ``SamplingParams.prompt_logprobs`` was set."""


def make_backend(name: str, ckpt, device: str, slots: int, capacity: int, model_path: Path,
                 compute_dtype: str | None = None, kv_cache_dtype: str | None = None, **kwargs) -> Backend:
    """The backend ``name`` over the loaded checkpoint (``compute_dtype``: the native backend's arithmetic)."""
    if name == "torch":
        from .backends.torch_backend import TorchBackend

        return TorchBackend(ckpt.model.to(device), slots, capacity, device)
    if name == "native":
        from .backends.native_backend import NativeBackend

        if device != "cpu":
            raise ValueError(f"the native backend runs on the CPU; for device={device!r} use backend='torch'")
        return NativeBackend(ckpt.model, slots, capacity, compute_dtype=compute_dtype or "float32",
                             kv_cache_dtype=kv_cache_dtype or "float32")
    if name == "onnxruntime":
        from .backends.onnxruntime_backend import OnnxRuntimeBackend

        kwargs.setdefault("device", device)  # device="cuda" selects the CUDA execution provider (or says it is missing)
        return OnnxRuntimeBackend.from_checkpoint(model_path, max_slots=slots, slot_capacity=capacity, **kwargs)
    if name == "tensorrt":
        from .backends.tensorrt_backend import TensorRTBackend

        return TensorRTBackend.from_checkpoint(model_path, max_slots=slots, slot_capacity=capacity, **kwargs)
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


def _slot_capacity(ec: EngineConfig, max_block: int) -> int:
    """Tokens a KV slot holds: the context, and the scratch of a fused row (two blocks) past it."""
    return ec.max_model_len + 2 * max_block


class LLM:
    """Load a model (default: SmolLM2-135M-Instruct, see :mod:`.models`; ``"tiny"``: the embedded stand-in) and
    generate or chat with any policy."""

    def __init__(self, model: str | Path | None = None, backend: str | None = None, device: str = "cpu",
                 dtype: str | None = None, max_num_seqs: int = 64, max_model_len: int | None = None,
                 engine_config: EngineConfig | None = None, compute_dtype: str | None = None,
                 kv_cache_dtype: str | None = None, prefix_cache: bool | None = None, **backend_kwargs):
        check_native_dtypes(compute_dtype, kv_cache_dtype)
        if backend is not None and backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        if backend is None:
            backend = default_backend(device, dtype)
        check_device(device, backend)
        check_native_dtypes_backend(backend, compute_dtype, kv_cache_dtype)
        self.backend_name = backend
        """The backend this LLM runs on (``backend=None`` picks :func:`~.backends.choice.default_backend`)."""
        if engine_config is None:
            ec = EngineConfig(max_num_seqs=check_positive_int("max_num_seqs", max_num_seqs))
        elif isinstance(engine_config, EngineConfig):
            ec = engine_config
        else:
            raise ValueError(f"engine_config must be an EngineConfig, got {type(engine_config).__name__}")
        if max_model_len is not None:
            ec.max_model_len = check_positive_int("max_model_len", max_model_len)
        if prefix_cache is not None:  # None: the engine config's (on by default)
            ec.prefix_cache = prefix_cache
        ec.validate()  # before anything is loaded: a bad setting should not cost a model load
        import torch

        path = resolve_model(model)
        # The native backend computes in float32 from bf16 weights as stored: no float32 copy is made
        # unless someone asks for the torch model (``checkpoint``), e.g. a reference forward in a test.
        self._widen_on_access = backend == "native" and dtype in (None, "float32") and \
            stored_dtype(path) == torch.bfloat16
        self._checkpoint = load_checkpoint(path, dtype="bfloat16" if self._widen_on_access else dtype)
        self._widen_lock = threading.Lock()
        self.config = self._checkpoint.config
        self.tokenizer = self._checkpoint.tokenizer
        self._render_chat = load_chat_template(path)
        ec.max_model_len = min(ec.max_model_len, self.config.max_position_embeddings)
        max_block = ec.max_block_size or min(32, 2 * self.config.block_size)
        if backend == "onnxruntime":
            # The export's profiles must cover what this engine sends: blocks up to max_block, fused
            # rows of 2·max_block, max_num_seqs rows.
            backend_kwargs.setdefault("export_kwargs", {"max_block": max_block,
                                                        "max_model_len": _slot_capacity(ec, max_block),
                                                        "max_batch": max(64, ec.max_num_seqs)})
        self.compute_dtype = compute_dtype or "float32"
        """The native backend's arithmetic for the projections and the head (float32 elsewhere)."""
        self.kv_cache_dtype = kv_cache_dtype or "float32"
        """The native backend's KV-cache storage."""
        self._backend_args = (device, path, backend_kwargs)   # what _new_backend builds a backend from
        self.backend = self._new_backend(ec, max_block)

        cost_key = {"model": self.config.fingerprint(), "backend": backend, "device": device,
                    "dtype": str(dtype), "threads": torch.get_num_threads(),
                    "draft_adapter": self._checkpoint.model.has_draft_adapter}
        # A float32 key stays what it was (cached cost tables remain valid).
        if self.compute_dtype != "float32":
            cost_key["compute_dtype"] = self.compute_dtype
        if self.kv_cache_dtype != "float32":
            cost_key["kv_cache_dtype"] = self.kv_cache_dtype
        # A table measured on another build of the kernel, or on another bf16 path (AMX, the dot
        # instruction, emulated), prices forwards that no longer cost that: such a key re-measures.
        if getattr(self.backend, "kernel", None):
            cost_key["kernel"] = self.backend.kernel
        if self.compute_dtype != "float32" and getattr(self.backend, "bf16_dot", None):
            cost_key["bf16_dot"] = self.backend.bf16_dot
        self._cost_key = cost_key
        self.engine = Engine(self.backend, self.config, ec, cost_key, draft_sampler=self._draft_sampler())
        self._loop: EngineLoop | None = None
        # One thread steps the engine at a time: generate() without the background loop steps it on the
        # caller's thread, so concurrent generate() calls (and the loop's start) take turns.
        self._step_lock = threading.Lock()

    def new_engine(self, clock: Callable[[], float] | None = None, max_num_seqs: int | None = None,
                   max_model_len: int | None = None) -> Engine:
        """Another engine over this model, with this LLM's settings: its own backend (KV cache, packed weights),
        policies, statistics and cost table. The step-interleaved bench runs one per policy.

        ``clock``: where the engine reads time (default ``time.perf_counter``); ``max_num_seqs``,
        ``max_model_len``: its own sizes, for a KV cache other than this LLM's (the context no longer than
        this LLM's)."""
        ec = copy.deepcopy(self.engine.config)
        if max_num_seqs is not None:
            ec.max_num_seqs = check_positive_int("max_num_seqs", max_num_seqs)
        if max_model_len is not None:
            ec.max_model_len = min(check_positive_int("max_model_len", max_model_len), ec.max_model_len)
        ec.validate()
        return Engine(self._new_backend(ec, self.engine.max_block), self.config, ec, self._cost_key, clock=clock,
                      draft_sampler=self._draft_sampler())

    def _new_backend(self, ec: EngineConfig, max_block: int) -> Backend:
        """A backend over this model for an engine of config ``ec``: KV slots for its sequences and its prefix cache."""
        device, path, backend_kwargs = self._backend_args
        return make_backend(self.backend_name, self._checkpoint, device, ec.max_num_seqs + ec.prefix_cache_slots,
                            _slot_capacity(ec, max_block), path, compute_dtype=self.compute_dtype,
                            kv_cache_dtype=self.kv_cache_dtype, **backend_kwargs)

    def _draft_sampler(self) -> DraftSampler | None:
        """The checkpoint's draft sampler; its per-token tables are built here from the torch model's embedding
        and head rows (read in pieces, as stored: no float32 copy of either is kept)."""
        weights = self._checkpoint.draft_sampler
        if weights is None:
            return None
        import torch

        def rows(weight):
            return lambda ids: weight.detach()[torch.from_numpy(ids)].float().numpy()

        model = self._checkpoint.model
        return DraftSampler(weights, rows(model.encoder.embed_tokens.weight), rows(model.diffusion_head.weight),
                            self.config.vocab_size)

    @property
    def checkpoint(self) -> Checkpoint:
        """The loaded checkpoint; its ``model`` is the torch model in the arithmetic dtype asked for (a
        native-backend LLM holds bf16 weights and widens them here, once, on first access)."""
        if self._widen_on_access:
            with self._widen_lock:
                if self._widen_on_access:
                    self._checkpoint.model.float()
                    self._widen_on_access = False
        return self._checkpoint

    @property
    def has_chat_template(self) -> bool:
        """Whether :meth:`chat_prompt` / :meth:`chat` can render this model's conversations."""
        return self._render_chat is not None

    # -- helpers ---------------------------------------------------------------------------
    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this checkpoint has no tokenizer.json: pass prompts as lists of token ids")
            if not prompt:
                raise ValueError("prompt is empty: give at least one character of text")
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"prompt is not valid Unicode text ({exc.reason} at position {exc.start}: "
                                 f"{prompt[exc.start]!r})") from None
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)):
            return list(prompt)
        raise ValueError(f"a prompt must be a string or a list of token ids, got {_describe(prompt)}")

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else ""

    # -- batch generation --------------------------------------------------------------------
    def generate(self, prompts: str | list[str] | list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Generate for every prompt (continuous batching); outputs in prompt order. Thread-safe."""
        prompts = _prompt_list(prompts)
        plist = _params_list(params, len(prompts))
        encoded = [self.encode(p) for p in prompts]
        for ids, p in zip(encoded, plist):
            self.engine.check(ids, p)
        watches = [_StopWatch(self.decode, p.stop, self.engine.cancel) if p.stop else None for p in plist]
        with self._step_lock:
            loop = self._loop
            if loop is None:
                reqs = [self.engine.submit(ids, p, on_tokens=w) for ids, p, w in zip(encoded, plist, watches)]
                self.engine.run_until_done()
        if loop is not None:  # the loop steps the engine; wait outside the lock
            handles = [loop.submit(ids, p, on_tokens=w) for ids, p, w in zip(encoded, plist, watches)]
            reqs = [h.result() for h in handles]
        return [_output(prompt, r, w, self.decode) for prompt, r, w in zip(prompts, reqs, watches)]

    # -- chat ---------------------------------------------------------------------------------
    def chat_prompt(self, messages: list[dict], system: str | None = None,
                    chat_template_kwargs: dict | None = None) -> str:
        """The prompt text of a conversation: the model's own chat template, with a generation prompt.

        ``messages``: ``[{"role": "user" | "assistant" | "system", "content": str}, ...]``; ``system``
        (optional) is put first as a system message; ``chat_template_kwargs``: extra template variables
        (Qwen3's ``{"enable_thinking": False}``), as transformers' ``apply_chat_template(**kwargs)`` passes them.
        """
        if self._render_chat is None:
            raise ValueError(f"{self._checkpoint.path}: this model has no chat template (no 'chat_template' in "
                             f"tokenizer_config.json): use generate() with a plain prompt")
        messages = check_messages(messages)
        if system is not None:
            if not isinstance(system, str):
                raise ValueError(f"system must be a string, got {type(system).__name__}")
            messages = [{"role": "system", "content": system}, *messages]
        return self._render_chat(messages, **check_template_kwargs(chat_template_kwargs))

    def chat(self, messages: list[dict] | list[list[dict]], params: SamplingParams | list[SamplingParams] | None = None,
             system: str | None = None, chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """Answer one conversation (a list of messages) or several (a list of them); stops at the model's
        end-of-turn token. Outputs in order, as :meth:`generate`'s. ``system`` and ``chat_template_kwargs``: as
        :meth:`chat_prompt`'s, for every conversation."""
        if isinstance(messages, (list, tuple)) and messages and all(isinstance(m, (list, tuple)) for m in messages):
            conversations = list(messages)
        else:
            conversations = [messages]
        return self.generate([self.chat_prompt(c, system, chat_template_kwargs) for c in conversations], params)

    # -- serving: background loop, streaming handles -----------------------------------------
    def submit(self, prompt: str | list[int], params: SamplingParams | None = None) -> RequestHandle:
        """Submit one request to the background loop (started on first use); returns a streaming handle.

        The handle streams the engine's tokens as they come: ``params.stop`` strings are not applied here (feed the
        tokens to :class:`~recguide_trt.text_stream.TextStream` and cancel on ``stopped``, as the servers do)."""
        params = _params_list(params, 1)[0]
        return self.start().submit(self.encode(prompt), params)

    def start(self) -> EngineLoop:
        """Start the background engine loop (if not running) and return it; servers submit through it."""
        with self._step_lock:  # waits for a generate() that is stepping the engine on its own thread
            if self._loop is None:
                self._loop = EngineLoop(self.engine)
            return self._loop

    def cancel(self, handle: RequestHandle) -> None:
        handle.cancel()

    def shutdown(self) -> None:
        with self._step_lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.shutdown()


class _StopWatch:
    """Cancels a request once its text holds one of its stop strings (called on the engine thread)."""

    def __init__(self, decode, stop: list[str], cancel):
        self.text = TextStream(decode, stop)
        self._cancel = cancel

    def __call__(self, request, tokens: list[int]) -> None:
        if tokens and not self.text.stopped:
            self.text.push(tokens)
            if self.text.stopped:
                self._cancel(request.id)


def _output(prompt, r, watch: _StopWatch | None, decode) -> RequestOutput:
    """The request's result; with a stop string found, its text ends before it, and its tokens (and their
    logprobs) with the token that completed it."""
    ids, text, reason = list(r.output_ids), None, r.finish_reason
    if watch is not None and watch.text.stopped:
        ids, text, reason = watch.text.ids, watch.text.sent, "stop"
    logprobs = list(r.output_logprobs[:len(ids)]) if r.params.logprobs is not None else None
    return RequestOutput(r.id, prompt, decode(ids) if text is None else text, ids, reason, r.metrics,
                         r.error, logprobs, r.prompt_logprobs)


def _describe(x) -> str:
    name = type(x).__name__
    if name == "ndarray":
        return "a numpy array (pass .tolist())"
    if isinstance(x, (bytes, bytearray)):
        return "bytes (decode them to str first)"
    return name


def _prompt_list(prompts) -> list:
    """One prompt or a list of them → a non-empty list of prompts (each a str or a list of token ids)."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (list, tuple)):
        if len(prompts) == 0:
            raise ValueError("prompts is empty: pass at least one prompt")
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
            return [list(prompts)]  # one prompt of token ids
        return list(prompts)
    raise ValueError(f"prompts must be a string, a list of strings or a list of token-id lists, got "
                     f"{_describe(prompts)}")


def _params_list(params, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if isinstance(params, (list, tuple)):
        bad = [type(p).__name__ for p in params if not isinstance(p, SamplingParams)]
        if bad:
            raise ValueError(f"params must be SamplingParams, got a list holding {', '.join(sorted(set(bad)))}")
        if len(params) != n:
            raise ValueError(f"got {len(params)} SamplingParams for {n} prompts")
        return list(params)
    raise ValueError(f"params must be a SamplingParams or a list of them, got {type(params).__name__} "
                     f"(build one: SamplingParams(max_tokens=..., ...))")


def check_messages(messages) -> list[dict]:
    """A conversation as a list of ``{"role", "content"}`` dicts with string fields, or a ValueError saying
    which message is off."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {_describe(m)}")
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                raise ValueError(f"messages[{i}].{key} must be a string, got {_describe(m.get(key))}")
    return [dict(m) for m in messages]


def check_positive_int(name: str, value) -> int:
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_device(device, backend: str) -> None:
    """A device this machine has, and one the backend runs on; otherwise a ValueError that says why."""
    if not isinstance(device, str) or not (device in ("cpu", "cuda") or device.startswith("cuda:")):
        raise ValueError(f"unknown device {device!r}; use 'cpu' or 'cuda' (or 'cuda:N')")
    if backend == "tensorrt" and device == "cpu":
        raise ValueError("the tensorrt backend runs on a CUDA GPU: use device='cuda'")
    if device.startswith("cuda") and backend == "onnxruntime":
        # Before the (slow) export: the CUDA execution provider must be there, or the run would be on the CPU.
        from .backends.onnxruntime_backend import resolve_providers

        resolve_providers(None, device)
    if device.startswith("cuda") and backend == "torch":
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} was asked for, but torch sees no CUDA GPU on this machine "
                             f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}): use device='cpu'")
        if ":" in device:
            index = device.split(":", 1)[1]
            if not index.isdigit() or int(index) >= torch.cuda.device_count():
                raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
