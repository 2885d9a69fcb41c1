"""OpenAI API request validation and error shapes for ``recguide serve``.

Requests are parsed by hand rather than by pydantic so that every rejection is a 400 in OpenAI's
error shape whose ``param`` names the field (pydantic would answer 422 in its own shape). Only
plain data leaves this module: :class:`GenerationRequest` holds the encoded prompts and one
:class:`SamplingParams`, which the app hands to the runtime.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..model.chat_template import check_template_kwargs
from ..runtime.logprobs import MAX_LOGPROBS
from ..runtime.params import POLICIES, SamplingParams

MAX_STOP_STRINGS = 4
"""OpenAI allows up to four stop sequences."""
DEFAULT_COMPLETION_TOKENS = 16
"""OpenAI's default ``max_tokens`` of /v1/completions (clipped to what the context leaves)."""
NO_OP_VALUES: dict[str, tuple] = {
    "tools": ([],), "functions": ([],), "tool_choice": ("none", "auto"), "function_call": ("none", "auto"),
    "guided_json": (), "guided_regex": (), "guided_choice": (), "guided_grammar": (),
}
"""Fields of OpenAI's API (tools, functions) and of vLLM's guided decoding that this server cannot honour, with
the values that ask for nothing: any other value is a 400 rather than silently ignored."""
LOGITS_FIELDS = ("presence_penalty", "frequency_penalty", "logit_bias", "top_k", "min_p", "repetition_penalty",
                 "min_tokens", "stop_token_ids")
"""OpenAI's penalties and ``logit_bias``, and vLLM's extra sampling parameters, passed to :class:`SamplingParams`
under the same names."""
MAX_CHOICES = 16
"""The most choices (``n``) one request may ask for per prompt."""
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


class APIError(Exception):
    """An error answered in OpenAI's JSON shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass
class ServingLimits:
    """What a request is checked against: the served model and the engine's limits."""

    model_names: tuple[str, ...]
    """Names a request's ``model`` may use (the first is what responses report)."""
    max_model_len: int
    """Prompt + output tokens of one request at most."""
    max_block_size: int
    """Largest ``block_size`` the engine accepts."""
    vocab_size: int
    """Token ids of a token-id prompt must be below this."""
    encode: Callable[[str], list[int]] | None
    """Text → token ids (None: the checkpoint has no tokenizer, only token-id prompts work)."""


@dataclass
class GenerationRequest:
    """A validated /v1/completions or /v1/chat/completions request."""

    model: str
    """The model name responses report."""
    prompts: list[list[int]]
    """Encoded prompts: one choice each."""
    params: SamplingParams
    """Shared by every prompt."""
    stream: bool = False
    include_usage: bool = False
    """``stream_options.include_usage``: a last chunk with ``usage`` (and the speculation metrics)."""
    return_token_ids: bool = False
    """Extra field: each choice (and chunk) also carries its output ``token_ids``."""
    echo: bool = False
    """Completions: each choice's text starts with its prompt's (and, with ``logprobs``, so do its log-probabilities:
    the first prompt token's are null)."""
    drop_output: bool = False
    """``echo`` with ``max_tokens`` 0: the engine still makes one token (its prefill does), which is not returned."""
    n: int = 1
    """Choices per prompt: prompt i's j-th is ``choices[i * n + j]`` (OpenAI's order); with a ``seed``, choice j
    samples with ``seed + j``."""

    def choice_params(self) -> list[SamplingParams]:
        """One SamplingParams per choice, in ``choices`` order."""
        seeds = [None if self.params.seed is None else self.params.seed + j for j in range(self.n)]
        return [replace(self.params, seed=seed) for _ in self.prompts for seed in seeds]

    def choice_prompts(self) -> list[list[int]]:
        """The prompt of every choice, in ``choices`` order."""
        return [ids for ids in self.prompts for _ in range(self.n)]


# -- field checks ------------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _same(v: Any, a: Any) -> bool:
    """``v == a`` as JSON means it: numbers by value (1 and 1.0 alike, booleans never), anything else by type too."""
    if _is_number(a):
        return _is_number(v) and v == a
    return type(v) is type(a) and v == a


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null",
            int: "integer", float: "number"}.get(type(v), type(v).__name__)


def _opt(body: dict, name: str, check: Callable[[Any], bool], expect: str, default: Any = None) -> Any:
    v = body.get(name)
    if v is None:
        return default
    if not check(v):
        raise APIError(f"'{name}' must be {expect}, got {_type_name(v)} {_short(v)}", name)
    return v


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _finite(name: str, v: float) -> float:
    if not math.isfinite(v):
        raise APIError(f"'{name}' must be a finite number, got {v}", name)
    return float(v)


def _text(name: str, s: str, encode: Callable[[str], list[int]] | None) -> list[int]:
    if not s:
        raise APIError(f"'{name}' is an empty string: give at least one character", name)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(f"'{name}' is not valid Unicode text ({exc.reason} at position {exc.start})", name) from None
    if encode is None:
        raise APIError(f"this model has no tokenizer: '{name}' must be token ids", name)
    ids = encode(s)
    if not ids:
        raise APIError(f"'{name}' encodes to no tokens", name)
    return ids


def _token_ids(name: str, ids: list, vocab: int) -> list[int]:
    if not ids:
        raise APIError(f"'{name}' is an empty token list", name)
    for t in ids:
        if not _is_int(t) or not 0 <= t < vocab:
            raise APIError(f"'{name}' token ids must be integers in [0, {vocab}), got {_short(t)}", name)
    return list(ids)


def parse_prompt(value: Any, limits: ServingLimits) -> list[list[int]]:
    """``prompt``: a string, a list of strings, a list of token ids or a list of token-id lists."""
    if value is None:
        raise APIError("'prompt' is required", "prompt")
    if isinstance(value, str):
        return [_text("prompt", value, limits.encode)]
    if not isinstance(value, list):
        raise APIError(f"'prompt' must be a string, an array of strings, an array of token ids or an array of "
                       f"token-id arrays, got {_type_name(value)}", "prompt")
    if not value:
        raise APIError("'prompt' is an empty array", "prompt")
    if all(_is_int(t) for t in value):
        return [_token_ids("prompt", value, limits.vocab_size)]
    if all(isinstance(p, str) for p in value):
        return [_text("prompt", p, limits.encode) for p in value]
    if all(isinstance(p, list) for p in value):
        return [_token_ids("prompt", p, limits.vocab_size) for p in value]
    raise APIError("'prompt' array must hold only strings, only token ids or only token-id arrays", "prompt")


def _check_model(body: dict, limits: ServingLimits) -> str:
    model = body.get("model")
    if model is None:
        return limits.model_names[0]
    if not isinstance(model, str):
        raise APIError(f"'model' must be a string, got {_type_name(model)}", "model")
    if model not in limits.model_names:
        raise APIError(f"the model '{model}' does not exist; this server serves '{limits.model_names[0]}'",
                       "model", code="model_not_found")
    return limits.model_names[0]


def _unsupported(body: dict) -> None:
    """Fields we cannot honour: a clear 400 rather than silently ignoring them."""
    if body.get("best_of") not in (None, 1):
        raise APIError("'best_of' is not supported (only 1)", "best_of")
    if body.get("echo") not in (None, False):
        raise APIError("'echo' is not supported", "echo")
    if body.get("suffix") is not None:
        raise APIError("'suffix' is not supported", "suffix")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise APIError("'response_format' is not supported (only {\"type\": \"text\"}): output is not constrained "
                       "to a format", "response_format")
    for name, allowed in NO_OP_VALUES.items():
        v = body.get(name)
        if v is not None and not any(_same(v, a) for a in allowed):
            only = f" (only {' or '.join(map(json.dumps, allowed))})" if allowed else ""
            raise APIError(f"'{name}' is not supported{only}: it would change what is generated", name)


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise APIError("'stop' must be a string or an array of strings", "stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise APIError(f"'stop' has {len(stop)} strings; at most {MAX_STOP_STRINGS} are allowed", "stop")
    if any(not s for s in stop):
        raise APIError("'stop' strings must not be empty", "stop")
    return stop


def _sampling(body: dict, limits: ServingLimits, prompts: list[list[int]], max_tokens_field: str,
              default_max_tokens: int | None) -> SamplingParams:
    longest = max(len(p) for p in prompts)
    if longest >= limits.max_model_len:
        raise APIError(f"the prompt has {longest} tokens; the context window is {limits.max_model_len} tokens: "
                       f"shorten 'prompt'", "messages" if max_tokens_field == "max_completion_tokens" else "prompt",
                       code="context_length_exceeded")
    room = limits.max_model_len - longest
    max_tokens = _opt(body, max_tokens_field, _is_int, "an integer")
    if max_tokens is None and max_tokens_field == "max_completion_tokens":
        max_tokens = _opt(body, "max_tokens", _is_int, "an integer")
        max_tokens_field = "max_tokens" if max_tokens is not None else max_tokens_field
    if max_tokens is None:
        max_tokens = room if default_max_tokens is None else min(default_max_tokens, room)
    elif max_tokens < 1:
        raise APIError(f"'{max_tokens_field}' must be >= 1, got {max_tokens}", max_tokens_field)
    elif max_tokens > room:
        raise APIError(f"'{max_tokens_field}' = {max_tokens} with a {longest}-token prompt exceeds the context window "
                       f"of {limits.max_model_len} tokens: ask for at most {room}", max_tokens_field,
                       code="context_length_exceeded")
    temperature = _finite("temperature", _opt(body, "temperature", _is_number, "a number", 1.0))
    if temperature < 0:
        raise APIError(f"'temperature' must be >= 0 (0 = greedy), got {temperature}", "temperature")
    top_p = _finite("top_p", _opt(body, "top_p", _is_number, "a number", 1.0))
    if not 0 < top_p <= 1:
        raise APIError(f"'top_p' must be in (0, 1], got {top_p}", "top_p")
    seed = _opt(body, "seed", _is_int, "an integer")
    if seed is not None and not 0 <= seed < 2**63:
        raise APIError(f"'seed' must be in [0, 2^63), got {seed}", "seed")
    policy = _opt(body, "policy", lambda v: isinstance(v, str), "a string", "recguide")
    if policy not in POLICIES:
        raise APIError(f"unknown 'policy' {policy!r}; choose one of {', '.join(POLICIES)}", "policy")
    block = _opt(body, "block_size", _is_int, "an integer")
    if block is not None and not 2 <= block <= limits.max_block_size:
        raise APIError(f"'block_size' must be in [2, {limits.max_block_size}] (a draft needs a seed and at least "
                       f"one masked position; the engine's largest block is {limits.max_block_size}), got {block}",
                       "block_size")
    ignore_eos = _opt(body, "ignore_eos", lambda v: isinstance(v, bool), "a boolean", False)
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, policy=policy,
                            block_size=block, stop_at_eos=not ignore_eos, **_logits_fields(body, limits))
    try:
        params.validate()
    except ValueError as exc:  # the messages start with the field's name
        name = str(exc).split(" ", 1)[0].split("[", 1)[0]
        if name not in LOGITS_FIELDS:
            raise APIError(str(exc)) from None
        raise APIError(f"'{name}'{str(exc)[len(name):]}", name) from None
    return params


def _logits_fields(body: dict, limits: ServingLimits) -> dict:
    """The penalties, ``logit_bias`` and vLLM's extras present in ``body``, type-checked (their ranges are
    :meth:`SamplingParams.validate`'s); token ids within the vocabulary."""
    out = {}
    for name in ("presence_penalty", "frequency_penalty", "min_p", "repetition_penalty"):
        if (v := _opt(body, name, _is_number, "a number")) is not None:
            out[name] = _finite(name, v)
    for name in ("top_k", "min_tokens"):
        if (v := _opt(body, name, _is_int, "an integer")) is not None:
            out[name] = v
    ids = _opt(body, "stop_token_ids", lambda v: isinstance(v, list), "an array of token ids")
    if ids:
        out["stop_token_ids"] = _token_ids("stop_token_ids", ids, limits.vocab_size)
    bias = _opt(body, "logit_bias", lambda v: isinstance(v, dict), "an object mapping token ids to biases")
    if bias:
        for key, v in bias.items():
            if not (key.isdigit() and int(key) < limits.vocab_size):
                raise APIError(f"'logit_bias' keys must be token ids in [0, {limits.vocab_size}), got {_short(key)}",
                               "logit_bias")
            if not _is_number(v):
                raise APIError(f"'logit_bias' values must be numbers, got {_type_name(v)} {_short(v)}", "logit_bias")
        out["logit_bias"] = {int(k): float(v) for k, v in bias.items()}
    return out


def _common(body: Any, limits: ServingLimits, prompts_of: Callable[[dict], list[list[int]]],
            max_tokens_field: str, default_max_tokens: int | None) -> GenerationRequest:
    if not isinstance(body, dict):
        raise APIError(f"the request body must be a JSON object, got {_type_name(body)}")
    model = _check_model(body, limits)
    _unsupported(body)
    stream = _opt(body, "stream", lambda v: isinstance(v, bool), "a boolean", False)
    options = _opt(body, "stream_options", lambda v: isinstance(v, dict), "an object", {})
    if options and not stream:
        raise APIError("'stream_options' is only allowed with 'stream': true", "stream_options")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise APIError("'stream_options.include_usage' must be a boolean", "stream_options.include_usage")
    stop = _stop(body)
    return_ids = _opt(body, "return_token_ids", lambda v: isinstance(v, bool), "a boolean", False)
    n = _opt(body, "n", _is_int, "an integer", 1)
    if not 1 <= n <= MAX_CHOICES:
        raise APIError(f"'n' must be in [1, {MAX_CHOICES}], got {n}", "n")
    prompts = prompts_of(body)
    params = _sampling(body, limits, prompts, max_tokens_field, default_max_tokens)
    params.stop = stop
    if params.seed is not None and params.seed + n - 1 >= 2**63:
        raise APIError(f"'seed' + 'n' - 1 must be < 2^63 (choice j samples with seed + j), got seed {params.seed}",
                       "seed")
    return GenerationRequest(model, prompts, params, stream, include_usage, return_ids, n=n)


def _top_count(body: dict, name: str) -> int | None:
    n = _opt(body, name, _is_int, "an integer")
    if n is not None and not 0 <= n <= MAX_LOGPROBS:
        raise APIError(f"'{name}' must be in [0, {MAX_LOGPROBS}], got {n}", name)
    return n


def _logprobs(body: dict, chat: bool) -> int | None:
    """``SamplingParams.logprobs`` from the body: a completion's ``logprobs`` (the alternatives per token), or a
    chat's ``logprobs`` (a boolean) with ``top_logprobs`` (the alternatives; only with ``logprobs: true``)."""
    if not chat:
        return _top_count(body, "logprobs")
    wanted = _opt(body, "logprobs", lambda v: isinstance(v, bool), "a boolean", False)
    top = _top_count(body, "top_logprobs")
    if top is not None and not wanted:
        raise APIError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return (top or 0) if wanted else None


def parse_completion(body: Any, limits: ServingLimits) -> GenerationRequest:
    """Validate a /v1/completions body (raises :class:`APIError`)."""
    echo = drop = False
    if isinstance(body, dict) and body.get("echo") is not None:
        echo = body["echo"]
        if not isinstance(echo, bool):
            raise APIError(f"'echo' must be a boolean, got {_type_name(echo)}", "echo")
        body = {k: v for k, v in body.items() if k != "echo"}  # _unsupported refuses it (chat has none)
        if echo and body.get("stream") is True:
            raise APIError("'echo' is not supported with 'stream': true", "echo")
        if echo and _is_int(body.get("max_tokens")) and body["max_tokens"] == 0:  # score the prompt only
            body["max_tokens"], drop = 1, True
    req = _common(body, limits, lambda b: parse_prompt(b.get("prompt"), limits), "max_tokens",
                  DEFAULT_COMPLETION_TOKENS)
    req.params.logprobs = _logprobs(body, chat=False)
    req.echo, req.drop_output = echo, drop
    if echo:
        req.params.prompt_logprobs = req.params.logprobs
    return req


def parse_messages(value: Any) -> list[dict]:
    """``messages``: a non-empty array of ``{"role", "content"}``; content as text or text parts."""
    if value is None:
        raise APIError("'messages' is required", "messages")
    if not isinstance(value, list) or not value:
        raise APIError("'messages' must be a non-empty array of message objects", "messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise APIError(f"'{where}' must be an object with 'role' and 'content'", where)
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise APIError(f"'{where}.role' must be one of {', '.join(CHAT_ROLES)}, got {_short(role)}",
                           f"{where}.role")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise APIError(f"'{where}.content[{j}]' must be a text part {{\"type\": \"text\", \"text\": ...}} "
                                   f"(this model reads text only)", f"{where}.content")
                parts.append(part["text"])
            content = "".join(parts)
        elif content is None and role == "assistant":
            content = ""
        elif not isinstance(content, str):
            raise APIError(f"'{where}.content' must be a string or an array of text parts", f"{where}.content")
        try:
            content.encode("utf-8")
        except UnicodeEncodeError:
            raise APIError(f"'{where}.content' is not valid Unicode text", f"{where}.content") from None
        msg = dict(m, content=content)
        out.append(msg)
    return out


def parse_chat(body: Any, limits: ServingLimits, render: Callable[..., str] | None) -> GenerationRequest:
    """Validate a /v1/chat/completions body; ``render(messages, **chat_template_kwargs)`` applies the chat
    template (None: the model has none)."""

    def prompts_of(b: dict) -> list[list[int]]:
        messages = parse_messages(b.get("messages"))
        try:
            template_kwargs = check_template_kwargs(b.get("chat_template_kwargs"))
        except ValueError as exc:
            raise APIError(f"'chat_template_kwargs' {str(exc).removeprefix('chat_template_kwargs ')}",
                           "chat_template_kwargs") from None
        if render is None:
            raise APIError("this model has no chat template (no 'chat_template' in its tokenizer_config.json): "
                           "use /v1/completions with a 'prompt'", "messages", code="no_chat_template")
        try:
            text = render(messages, **template_kwargs)
        except Exception as exc:  # the template's own raise_exception(), or a template error
            raise APIError(f"the chat template rejected 'messages': {exc}", "messages") from None
        return [_text("messages", text, limits.encode)]

    req = _common(body, limits, prompts_of, "max_completion_tokens", None)
    req.params.logprobs = _logprobs(body, chat=True)
    return req
