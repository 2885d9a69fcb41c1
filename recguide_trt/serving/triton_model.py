"""Triton Inference Server python-backend model serving RecGuide (decoupled, streaming).

``recguide triton-repo`` copies this file to ``<repo>/recguide/1/model.py``. Each model instance
owns one :class:`recguide_trt.LLM` with its own background engine loop; every request is
submitted with ``llm.submit`` (so concurrent requests are batched together by the engine's
continuous batching) and a thread per request streams its tokens through the decoupled response
sender. A watcher thread polls the senders for client cancellation and cancels the engine
request, so a client that goes away frees its KV-cache slot at the next engine step.

The wire protocol (inputs, outputs, validation) lives in
:mod:`recguide_trt.serving.triton_protocol`. This module imports ``triton_python_backend_utils``
only when it exists (inside Triton's stub), so the logic can be tested with a stand-in.
"""

from __future__ import annotations

import json
import threading
import traceback

try:  # provided by Triton's python backend stub
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - outside Triton
    pb_utils = None

from recguide_trt.serving.triton_protocol import (
    INPUT_NAMES,
    RequestError,
    TextStreamer,
    final_outputs,
    parse_request,
    require_numpy_1,
    text_tensor,
)

CANCEL_POLL_S = 0.05
"""How often the watcher asks Triton whether a live request was cancelled."""


def _error(message: str, code: str | None = None):
    err_cls = pb_utils.TritonError
    code_value = getattr(err_cls, code, None) if code else None
    if code_value is not None:
        try:
            return err_cls(message, code_value)
        except TypeError:  # older stubs take the message only
            pass
    return err_cls(message)


def _recguide_parameter(text: str | None) -> list[str] | None:
    """The ``FIELD=VALUE`` overrides of RecGuide's config in the ``recguide`` parameter (a JSON list, as ``recguide
    triton-repo --recguide`` writes it); None without one. A ``ValueError`` naming the parameter otherwise."""
    if not text:
        return None
    try:
        items = json.loads(text)
    except json.JSONDecodeError:
        items = None
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise ValueError(f"parameter recguide must be a JSON list of FIELD=VALUE strings, got {text!r}")
    return items


def _log(level: str, message: str) -> None:
    logger = getattr(pb_utils, "Logger", None)
    if logger is not None:
        getattr(logger, f"log_{level}", logger.log_info)(message)
    else:  # pragma: no cover
        print(f"[recguide] {message}", flush=True)


class _Live:
    """One request in flight: its Triton request, response sender and engine handle."""

    __slots__ = ("request", "sender", "handle", "cancelled")

    def __init__(self, request, sender, handle):
        self.request = request
        self.sender = sender
        self.handle = handle
        self.cancelled = False


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        require_numpy_1()
        from recguide_trt import LLM
        from recguide_trt.runtime.config_overrides import engine_config_with_recguide

        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise RuntimeError("the recguide model streams its output: set model_transaction_policy "
                               "{ decoupled: true } in config.pbtxt")
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}

        def get(key: str, default: str | None = None) -> str | None:
            value = params.get(key, "")
            return value if value not in ("", None) else default

        kind = str(args.get("model_instance_kind", "CPU")).upper()
        device = f"cuda:{args.get('model_instance_device_id', 0)}" if kind == "GPU" else "cpu"
        threads = get("torch_threads")
        if threads:
            import torch

            torch.set_num_threads(int(threads))
        model = get("model_path", "default")
        max_model_len = get("max_model_len")
        max_num_seqs = int(get("max_num_seqs", "64"))
        self.default_policy = get("default_policy", "recguide")
        self.max_tokens_limit = int(get("max_tokens_limit", "1024"))
        prefix_cache = get("prefix_cache", "true").strip().lower()
        if prefix_cache not in ("true", "false"):
            raise ValueError(f"parameter prefix_cache must be true or false, got {prefix_cache!r}")
        self.llm = LLM(model=None if model == "default" else model, backend=get("backend", "torch"), device=device,
                       dtype=get("dtype"), compute_dtype=get("compute_dtype"), kv_cache_dtype=get("kv_cache_dtype"),
                       max_num_seqs=max_num_seqs,
                       engine_config=engine_config_with_recguide(max_num_seqs, _recguide_parameter(get("recguide")),
                                                                 flag="parameter recguide"),
                       max_model_len=int(max_model_len) if max_model_len else None,
                       prefix_cache=prefix_cache == "true")
        if self.llm.tokenizer is None:
            raise RuntimeError(f"checkpoint {model} has no tokenizer.json: the Triton model takes and returns text, "
                               f"so the checkpoint directory needs one")
        self.max_tokens_limit = min(self.max_tokens_limit, self.llm.engine.config.max_model_len - 1)
        self._lock = threading.Lock()
        self._live: dict[int, _Live] = {}
        self._threads: set[threading.Thread] = set()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="recguide-cancel-watch", daemon=True)
        self._watcher.start()
        _log("info", f"recguide model ready: model={model} backend={get('backend', 'torch')} device={device} "
                     f"policy={self.default_policy} max_tokens_limit={self.max_tokens_limit}")

    # -- requests --------------------------------------------------------------------------
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                parsed = parse_request(lambda name, r=request: self._input(r, name),
                                       default_policy=self.default_policy, max_tokens_limit=self.max_tokens_limit)
                handle = self.llm.submit(parsed.text, parsed.params)
            except (RequestError, ValueError) as exc:
                self._send_error(sender, str(exc), "INVALID_ARG")
                continue
            except Exception as exc:  # keep serving whatever one request did
                _log("error", f"submit failed: {traceback.format_exc()}")
                self._send_error(sender, f"internal error: {type(exc).__name__}: {exc}", "INTERNAL")
                continue
            live = _Live(request, sender, handle)
            thread = threading.Thread(target=self._stream, args=(live, parsed.stream), daemon=True,
                                      name=f"recguide-stream-{handle.id}")
            with self._lock:
                self._live[handle.id] = live
                self._threads.add(thread)
            thread.start()
        return None

    @staticmethod
    def _input(request, name: str):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    def _send_error(self, sender, message: str, code: str | None = None) -> None:
        try:
            sender.send(pb_utils.InferenceResponse(output_tensors=[], error=_error(message, code)),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # the client may be gone already
            pass

    def _stream(self, live: _Live, stream: bool) -> None:
        handle = live.handle
        streamer = TextStreamer(self.llm.decode)
        try:
            for ids in handle:
                if not stream:
                    continue
                chunk = streamer.feed(ids)
                if chunk and not live.cancelled:
                    live.sender.send(pb_utils.InferenceResponse(
                        output_tensors=[pb_utils.Tensor("text_output", text_tensor(chunk))]))
            req = handle.result()
            with self._lock:  # no cancellation polling once the final response goes out
                self._live.pop(handle.id, None)
            if req.finish_reason == "cancelled":
                _log("info", f"request {req.id} cancelled after {len(req.output_ids)} tokens; engine slot freed")
                self._send_error(live.sender, f"request {req.id} was cancelled", "CANCELLED")
            elif req.error:
                self._send_error(live.sender, f"generation failed: {req.error}", "INTERNAL")
            else:
                if stream:
                    streamer.ids = list(req.output_ids)
                    rest = streamer.finish()
                else:
                    rest = self.llm.decode(req.output_ids)
                tensors = final_outputs(req.output_ids, req.metrics, req.finish_reason, rest,
                                        req.output_logprobs if req.params.logprobs is not None else None)
                live.sender.send(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(name, value) for name, value in tensors.items()]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:  # a send failed (client gone) or something unexpected: free the request
            handle.cancel()
            with self._lock:
                self._live.pop(handle.id, None)
            _log("warn", f"request {handle.id}: {type(exc).__name__}: {exc}")
            self._send_error(live.sender, f"internal error: {type(exc).__name__}: {exc}", "INTERNAL")
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _watch(self) -> None:
        while not self._stop.wait(CANCEL_POLL_S):
            with self._lock:
                for live in list(self._live.values()):
                    if live.cancelled:
                        continue
                    try:
                        gone = live.sender.is_cancelled() or live.request.is_cancelled()
                    except Exception:
                        gone = False
                    if gone:
                        live.cancelled = True
                        live.handle.cancel()

    # -- shutdown --------------------------------------------------------------------------
    def finalize(self) -> None:
        self._stop.set()
        with self._lock:
            for live in self._live.values():
                live.cancelled = True
                live.handle.cancel()
            threads = list(self._threads)
        for t in threads:
            t.join(timeout=5)
        self.llm.shutdown()
        self._watcher.join(timeout=1)


__all__ = ["INPUT_NAMES", "TritonPythonModel"]
