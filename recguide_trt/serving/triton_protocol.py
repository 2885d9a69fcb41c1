"""The wire protocol of the ``recguide`` Triton model, in plain Python and numpy (no Triton import).

The generated ``model.py`` (see :mod:`recguide_trt.serving.triton_model`) only moves tensors in
and out of Triton; everything a request can get wrong is checked here, so it is unit-tested
without a server.

Inputs (all declared ``optional`` in ``config.pbtxt`` so that a missing one reaches the model and
gets a clear message instead of Triton's generic shape error; every tensor has shape ``[1]``):

================== ======== ==========================================================================
name               type     meaning
================== ======== ==========================================================================
text_input         BYTES    the prompt (UTF-8), required, not empty
max_tokens         INT32    new tokens at most, required, 1 … the repository's max_tokens_limit
temperature        FP32     0 = greedy (default)
top_p              FP32     nucleus mass in (0, 1] (default 1)
top_k              INT32    sample from the k most likely tokens (0, the default: all)
seed               INT64    sampling seed (default: drawn by the engine)
policy             BYTES    "ar" | "linearspec" | "recguide" | "lookup" | a peer controller (default: the repository's policy)
block_size         INT32    draft block size >= 2 (default: the policy's)
stream             BOOL     true: one response per emitted chunk; false (default): one response
return_log_probs   BOOL     true: the final response carries each output token's log-probability
repetition_penalty FP32     > 0 (1, the default: off): a seen token's logit divided / multiplied by it
presence_penalty   FP32     in [-2, 2] (default 0), OpenAI's
frequency_penalty  FP32     in [-2, 2] (default 0), OpenAI's
min_length         INT32    EOS banned before this many new tokens (default 0)
================== ======== ==========================================================================

The last four keep TensorRT-LLM's ensemble names; every policy equals AR under them.

Outputs: ``text_output`` (BYTES ``[1]``) on every response — the new text of the chunk when
streaming, the whole text otherwise. The final response (``TRITONSERVER_RESPONSE_COMPLETE_FINAL``)
also carries ``output_token_ids`` (INT32 ``[n]``), ``draft_tokens``, ``accepted_draft_tokens``,
``forwards`` (INT32 ``[1]``: backbone forwards of the request, prefill included), ``mal`` and ``tpf``
(FP32 ``[1]``) and ``finish_reason`` (BYTES ``[1]``: "length" or "eos"), and, as TensorRT-LLM's backend names
them, ``output_log_probs`` (FP32 ``[n]``: each output token's log-probability under the model, the same under
every policy; ``[0]`` unless ``return_log_probs``) and ``cum_log_probs`` (FP32 ``[1]``: their sum).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..runtime.params import POLICIES, SamplingParams


@dataclass(frozen=True)
class TensorSpec:
    name: str
    """Tensor name."""
    triton_type: str
    """Triton data type without the ``TYPE_`` prefix (``STRING`` is the config's name for BYTES)."""
    dims: tuple[int, ...]
    """Shape (max_batch_size is 0, so this is the full shape)."""
    optional: bool = True
    """Inputs only: may be left out."""

    @property
    def wire_type(self) -> str:
        """The datatype name clients use (``BYTES`` for strings)."""
        return "BYTES" if self.triton_type == "STRING" else self.triton_type


INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_input", "STRING", (1,)),
    TensorSpec("max_tokens", "INT32", (1,)),
    TensorSpec("temperature", "FP32", (1,)),
    TensorSpec("top_p", "FP32", (1,)),
    TensorSpec("seed", "INT64", (1,)),
    TensorSpec("policy", "STRING", (1,)),
    TensorSpec("block_size", "INT32", (1,)),
    TensorSpec("stream", "BOOL", (1,)),
    TensorSpec("return_log_probs", "BOOL", (1,)),
    TensorSpec("top_k", "INT32", (1,)),
    TensorSpec("repetition_penalty", "FP32", (1,)),
    TensorSpec("presence_penalty", "FP32", (1,)),
    TensorSpec("frequency_penalty", "FP32", (1,)),
    TensorSpec("min_length", "INT32", (1,)),
)
SAMPLING_INPUTS = {"temperature": "temperature", "top_p": "top_p", "seed": "seed", "block_size": "block_size",
                   "top_k": "top_k", "repetition_penalty": "repetition_penalty",
                   "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                   "min_length": "min_tokens"}
"""Inputs copied into :class:`SamplingParams` when present: input name -> field name."""
OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_output", "STRING", (-1,)),
    TensorSpec("output_token_ids", "INT32", (-1,)),
    TensorSpec("draft_tokens", "INT32", (1,)),
    TensorSpec("accepted_draft_tokens", "INT32", (1,)),
    TensorSpec("forwards", "INT32", (1,)),
    TensorSpec("mal", "FP32", (1,)),
    TensorSpec("tpf", "FP32", (1,)),
    TensorSpec("finish_reason", "STRING", (1,)),
    TensorSpec("output_log_probs", "FP32", (-1,)),
    TensorSpec("cum_log_probs", "FP32", (1,)),
)
INPUT_NAMES = tuple(s.name for s in INPUTS)
OUTPUT_NAMES = tuple(s.name for s in OUTPUTS)

_KINDS = {"STRING": "a BYTES string", "INT32": "an INT32 integer", "INT64": "an INT64 integer",
          "FP32": "an FP32 number", "BOOL": "a BOOL"}


class RequestError(ValueError):
    """A request the model refuses; the message goes back to the client as the error."""


@dataclass
class ParsedRequest:
    """A validated request."""

    text: str
    """The prompt."""
    params: SamplingParams
    """Decoding parameters (validated)."""
    stream: bool
    """One response per chunk (True) or a single response (False)."""


def _scalar(name: str, value: np.ndarray, triton_type: str):
    arr = np.asarray(value)
    if arr.size != 1:
        raise RequestError(f"{name} must hold exactly one value (shape [1]), got shape {list(arr.shape)}")
    item = arr.reshape(-1)[0]
    what = _KINDS[triton_type]
    if triton_type == "STRING":
        if isinstance(item, (bytes, np.bytes_)):
            try:
                return bytes(item).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RequestError(f"{name} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
        if isinstance(item, str):
            return item
        raise RequestError(f"{name} must be {what}, got {arr.dtype}")
    if triton_type == "BOOL":
        if arr.dtype != np.bool_:
            raise RequestError(f"{name} must be {what}, got {arr.dtype}")
        return bool(item)
    if triton_type in ("INT32", "INT64"):
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise RequestError(f"{name} must be {what}, got {arr.dtype}")
        return int(item)
    if triton_type == "FP32":
        if not np.issubdtype(arr.dtype, np.floating):
            raise RequestError(f"{name} must be {what}, got {arr.dtype}")
        v = float(item)
        if not np.isfinite(v):
            raise RequestError(f"{name} must be a finite number, got {v}")
        return v
    raise AssertionError(triton_type)  # pragma: no cover


def parse_request(get: Callable[[str], np.ndarray | None], *, default_policy: str = "recguide",
                  max_tokens_limit: int = 1024) -> ParsedRequest:
    """Validate one request. ``get(name)`` returns the input as a numpy array, or None when absent.

    Raises :class:`RequestError` with a message meant for the client.
    """
    values = {}
    for spec in INPUTS:
        arr = get(spec.name)
        values[spec.name] = None if arr is None else _scalar(spec.name, arr, spec.triton_type)

    text = values["text_input"]
    if text is None:
        raise RequestError("text_input is missing: send the prompt as a BYTES tensor named 'text_input' (shape [1])")
    if not text:
        raise RequestError("text_input is empty: send at least one character of prompt text")
    max_tokens = values["max_tokens"]
    if max_tokens is None:
        raise RequestError(f"max_tokens is missing: send an INT32 tensor 'max_tokens' (shape [1]) between 1 and "
                           f"{max_tokens_limit}")
    if max_tokens <= 0:
        raise RequestError(f"max_tokens must be a positive integer, got {max_tokens}")
    if max_tokens > max_tokens_limit:
        raise RequestError(f"max_tokens {max_tokens} exceeds this server's limit of {max_tokens_limit} "
                           f"(max_tokens_limit in config.pbtxt)")
    policy = values["policy"] if values["policy"] is not None else default_policy
    if policy not in POLICIES:
        raise RequestError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    params = SamplingParams(max_tokens=max_tokens, policy=policy)
    for name, field in SAMPLING_INPUTS.items():
        if values[name] is not None:
            setattr(params, field, values[name])
    if values["return_log_probs"]:
        params.logprobs = 0
    try:
        params.validate()
    except ValueError as exc:  # the messages name SamplingParams' fields: min_length is min_tokens there
        message = str(exc)
        raise RequestError("min_length" + message[len("min_tokens"):] if message.startswith("min_tokens")
                           else message) from None
    return ParsedRequest(text=text, params=params, stream=bool(values["stream"]) if values["stream"] is not None
                         else False)


def text_tensor(text: str) -> np.ndarray:
    """A BYTES ``[1]`` tensor."""
    return np.array([text.encode("utf-8")], dtype=np.object_)


def final_outputs(output_ids: Sequence[int], metrics, finish_reason: str | None, text: str,
                  logprobs: Sequence | None = None) -> dict[str, np.ndarray]:
    """The tensors of the final response of a finished request (``metrics``: RequestMetrics; ``logprobs``: its
    ``output_logprobs`` when ``return_log_probs`` asked for them)."""
    values = [e.logprob for e in logprobs or ()]
    return {
        "text_output": text_tensor(text),
        "output_token_ids": np.asarray(list(output_ids), dtype=np.int32),
        "draft_tokens": np.array([metrics.drafted_tokens], dtype=np.int32),
        "accepted_draft_tokens": np.array([metrics.accepted_draft_tokens], dtype=np.int32),
        "forwards": np.array([sum(metrics.forwards.values())], dtype=np.int32),
        "mal": np.array([metrics.mal], dtype=np.float32),
        "tpf": np.array([metrics.tpf], dtype=np.float32),
        "finish_reason": text_tensor(finish_reason or ""),
        "output_log_probs": np.array(values, dtype=np.float32),
        "cum_log_probs": np.array([float(np.sum(values))], dtype=np.float32),
    }


class TextStreamer:
    """Incremental detokenization: the chunks it returns concatenate to ``decode(all ids)``.

    Text that ends in an incomplete UTF-8 sequence (byte-level BPE splits characters) is held
    back until the next token completes it.
    """

    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode = decode
        self.ids: list[int] = []
        self.sent = ""

    def feed(self, new_ids: Sequence[int]) -> str:
        self.ids.extend(int(t) for t in new_ids)
        text = self._decode(self.ids)
        if text.endswith("\ufffd"):
            text = text.rstrip("\ufffd")
        return self._advance(text)

    def finish(self) -> str:
        """The remaining text once the request ended (may be empty)."""
        return self._advance(self._decode(self.ids))

    def _advance(self, text: str) -> str:
        # Normally ``text`` extends what was sent. If the decoder ever revises earlier text (rare
        # clean-up rules), what was sent stays sent and only the part past its length follows.
        chunk = text[len(self.sent):]
        if len(text) >= len(self.sent):
            self.sent = text
        return chunk


def require_numpy_1(version: str | None = None) -> None:
    """Refuse numpy >= 2 inside Triton's python backend stub, loudly.

    The stub's bundled bindings (Triton 2.51 as shipped in ``nvidia-pytriton``) misread numpy 2
    arrays: string inputs arrive garbled and uint8/string outputs arrive empty, silently.
    """
    import sys

    version = version or np.__version__
    if int(version.split(".")[0]) >= 2:
        raise RuntimeError(
            f"numpy {version} is loaded in Triton's python backend stub (interpreter prefix {sys.prefix}); "
            f"the stub's bindings need numpy<2 (with numpy 2 string tensors are silently garbled). Install "
            f"'numpy<2' in the serving environment and start tritonserver with that environment's bin/ first "
            f"on PATH, or set the EXECUTION_ENV_PATH parameter of config.pbtxt to it "
            f"(recguide triton-repo --execution-env DIR)")
