"""An OpenAI-compatible ASGI app over one :class:`~recguide_trt.api.LLM` (``recguide serve``).

``create_app(llm)`` returns a Starlette app: POST /v1/completions and /v1/chat/completions
(streaming as server-sent events), GET /v1/models, /health and /metrics. The app is a layer above
the runtime: it validates requests (``openai_protocol``), submits them to the LLM's background
engine loop (``LLM.start``), turns the streamed token ids into text (``text_stream``) and shapes the
answers (``openai_responses``); the runtime knows nothing about HTTP. Another front end (a Ray Serve
deployment) can mount the same app.

Every error is OpenAI's JSON shape; bad input is a 400 naming the field. A client that disconnects
cancels its requests (their KV slots are freed at the engine's next step).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..model.chat_template import load_chat_template
from ..runtime.handles import RequestHandle
from ..text_stream import TextStream
from . import openai_responses as shapes
from .openai_metrics import CONTENT_TYPE, ServerMetrics
from .openai_protocol import (
    APIError,
    GenerationRequest,
    ServingLimits,
    error_body,
    parse_chat,
    parse_completion,
)

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 2**20
"""Larger request bodies get a 413 (a prompt that long could not fit the context anyway)."""
DISCONNECT_POLL_S = 0.25
"""How often a non-streaming request checks whether its client is still there."""


@dataclass
class ServeConfig:
    """Settings of one OpenAI server over one LLM."""

    served_model_name: str | None = None
    """The name clients pass as ``model`` (default: the checkpoint directory's name)."""
    api_key: str | None = None
    """When set, /v1/* requests need ``Authorization: Bearer <api_key>`` (401 otherwise)."""
    max_queue: int | None = None
    """Requests allowed to wait for a slot beyond the running ones; more get a 503 with Retry-After."""
    retry_after_s: int = 1
    """The Retry-After of a 503."""


@dataclass
class _ChoiceResult:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str
    """OpenAI's: stop / length; "abort" (client gone) or "error" (engine failure)."""
    handle: RequestHandle
    error: str | None = None
    logprobs: dict | None = None
    """``choices[i].logprobs`` of ``token_ids`` (None unless asked for)."""


def check_api_key(key: str | None, request: Request) -> None:
    """401 unless ``request`` carries ``Authorization: Bearer <key>`` (anything passes when ``key`` is None)."""
    if key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise APIError("missing or wrong API key: send 'Authorization: Bearer <key>'", status=401,
                       type="authentication_error", code="invalid_api_key")


class OpenAIServer:
    """The state behind the routes: the LLM, its engine loop, limits, chat template and metrics."""

    def __init__(self, llm, config: ServeConfig | None = None):
        self.llm = llm
        self.engine = llm.engine
        self.config = config = config or ServeConfig()
        if config.max_queue is not None and config.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {config.max_queue}")
        self.model_name = config.served_model_name or llm.checkpoint.path.name
        self.loop = llm.start()
        tok = llm.tokenizer
        self.limits = ServingLimits(model_names=(self.model_name,), max_model_len=self.engine.config.max_model_len,
                                    max_block_size=self.engine.max_block, vocab_size=llm.config.vocab_size,
                                    encode=tok.encode if tok is not None else None)
        self.render_chat = load_chat_template(llm.checkpoint.path)
        self.metrics = ServerMetrics(self.engine, self.model_name)
        self.created = int(time.time())

    # -- checks -----------------------------------------------------------------------------
    def check_auth(self, request: Request) -> None:
        check_api_key(self.config.api_key, request)

    def model_list(self) -> dict:
        """The body of ``GET /v1/models`` (the Ray ingress serves it from the replicas' reports)."""
        return {"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created, "owned_by": "recguide-trt",
            "root": str(self.llm.checkpoint.path), "max_model_len": self.limits.max_model_len}]}

    def check_capacity(self, n: int) -> None:
        """503 when ``n`` more requests would leave more than ``max_queue`` waiting for a slot."""
        limit = self.config.max_queue
        if limit is None:
            return
        occ = self.engine.occupancy()
        would_wait = occ["waiting"] + occ["running"] + n - self.engine.config.max_num_seqs
        if would_wait > limit:
            raise APIError(f"the server is at capacity ({occ['running']} running, {occ['waiting']} waiting; "
                           f"--max-queue {limit}): retry later", status=503, type="server_error",
                           code="queue_full", headers={"Retry-After": str(self.config.retry_after_s)})

    # -- generation -------------------------------------------------------------------------
    def submit(self, req: GenerationRequest) -> list[RequestHandle]:
        prompts, params = req.choice_prompts(), req.choice_params()
        self.check_capacity(len(prompts))
        for ids, p in zip(prompts, params):  # all or nothing: no choice starts when another is refused
            try:
                self.engine.check(ids, p)
            except ValueError as exc:
                raise APIError(str(exc)) from None
        return [self.loop.submit(ids, p) for ids, p in zip(prompts, params)]

    def _finish(self, index: int, handle: RequestHandle, text: TextStream, chat: bool) -> _ChoiceResult:
        r = handle.request
        if text.stopped:
            reason = "stop"
        elif r.finish_reason == "cancelled":
            reason = "abort"
        else:
            reason = shapes.FINISH_REASONS.get(r.finish_reason, "error")
        self.metrics.observe(r.metrics, reason, r.params.policy)
        logprobs = None
        if r.params.logprobs is not None:  # the engine appends a token's logprob before the token itself
            logprobs = shapes.logprobs_body(chat, r.output_logprobs[:len(text.ids)], self.token_text)
        return _ChoiceResult(index, text.sent, list(text.ids), reason, handle,
                             r.error if reason == "error" else None, logprobs)

    def echoed(self, result: _ChoiceResult, prompt_ids: list[int], req: GenerationRequest) -> _ChoiceResult:
        """``echo``: the prompt's text (and log-probabilities) before the output's; ``max_tokens`` 0 drops the
        one token the engine made."""
        out_ids = [] if req.drop_output else result.token_ids
        text = self.llm.decode(prompt_ids) + ("" if req.drop_output else result.text)
        logprobs = None
        if req.params.logprobs is not None:
            r = result.handle.request
            logprobs = shapes.echo_logprobs_body(prompt_ids, r.prompt_logprobs or [],
                                                 r.output_logprobs[:len(out_ids)], self.token_text)
        return replace(result, text=text, token_ids=out_ids, logprobs=logprobs)

    def token_text(self, token_id: int) -> str:
        """One token's text, as ``logprobs`` name it."""
        return self.llm.decode([token_id])

    async def run_choice(self, index: int, handle: RequestHandle, req: GenerationRequest,
                         events: asyncio.Queue | None, chat: bool = False) -> _ChoiceResult:
        """Consume one request's tokens; with ``events``, put ``(index, delta, new_ids, logprobs)`` for each piece
        (``logprobs``: the chunk's ``choices[i].logprobs``, or None)."""
        text = TextStream(self.llm.decode, req.params.stop)
        lps = handle.request.output_logprobs if req.params.logprobs is not None else None
        offset = 0  # characters of the tokens streamed so far (a completion's text_offset)
        async for ids in handle:
            if text.stopped:
                continue  # the cancel is on its way; the request's end brings the final metrics
            start = len(text.ids)
            delta = text.push(ids)
            if text.stopped:
                handle.cancel()
            piece = None
            if lps is not None and events is not None:
                piece = shapes.logprobs_body(chat, lps[start:start + len(ids)], self.token_text, offset)
                if not chat:  # the tokens' texts are in the piece already
                    offset += sum(map(len, piece["tokens"]))
            if events is not None and (delta or req.return_token_ids or piece is not None):
                events.put_nowait((index, delta, ids, piece))
        tail = text.finish()
        if events is not None and tail:
            events.put_nowait((index, tail, [], None))
        result = self._finish(index, handle, text, chat)
        if events is not None:
            events.put_nowait((index, None, result, None))
        return result

    def spec_metrics(self, handles: list[RequestHandle], params) -> dict:
        mode = self.engine.policies["recguide"].mode
        return {"speculative_decoding": shapes.speculative_decoding([h.request.metrics for h in handles],
                                                                    params.policy, mode)}


def _cached_tokens(handles: list[RequestHandle]) -> int:
    return sum(h.request.metrics.cached_prompt_tokens for h in handles)


def _cancel_unfinished(handles: list[RequestHandle]) -> None:
    for h in handles:
        if not h.request.done:
            h.cancel()


async def _read_json(request: Request):
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(f"the request body has {len(raw)} bytes; at most {MAX_BODY_BYTES} are accepted", status=413)
    if not raw.strip():
        raise APIError("the request body is empty: send a JSON object")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise APIError(f"the request body is not valid JSON ({exc})") from None


def _error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _generate(server: OpenAIServer, request: Request, chat: bool) -> Response:
    server.check_auth(request)
    body = await _read_json(request)
    req = parse_chat(body, server.limits, server.render_chat) if chat else parse_completion(body, server.limits)
    handles = server.submit(req)
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())
    if req.stream:
        return StreamingResponse(_stream(server, req, handles, rid, created, chat), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    tasks = [asyncio.create_task(server.run_choice(i, h, req, None, chat)) for i, h in enumerate(handles)]
    try:
        pending = set(tasks)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=DISCONNECT_POLL_S)
            if pending and await request.is_disconnected():
                _cancel_unfinished(handles)   # the tasks end with the requests
    finally:
        _cancel_unfinished(handles)
    results = [t.result() for t in tasks]
    failed = next((r for r in results if r.finish_reason == "error"), None)
    if failed is not None:
        raise APIError(f"generation failed: {failed.error}", status=500, type="server_error", code="engine_error")
    if req.echo:
        results = [server.echoed(r, ids, req) for r, ids in zip(results, req.choice_prompts())]
    choices = [shapes.choice(chat, r.index, r.text, r.finish_reason, r.token_ids if req.return_token_ids else None,
                             logprobs=r.logprobs) for r in results]
    out = shapes.envelope(chat, rid, created, req.model, choices)
    out["usage"] = shapes.usage(sum(map(len, req.prompts)), sum(len(r.token_ids) for r in results),
                                _cached_tokens(handles))
    out["metrics"] = server.spec_metrics(handles, req.params)
    return JSONResponse(out)


async def _stream(server: OpenAIServer, req: GenerationRequest, handles: list[RequestHandle], rid: str,
                  created: int, chat: bool):
    events: asyncio.Queue = asyncio.Queue()
    tasks = [asyncio.create_task(server.run_choice(i, h, req, events, chat)) for i, h in enumerate(handles)]
    ids_or_none = (lambda ids: list(ids)) if req.return_token_ids else (lambda ids: None)

    def chunk(choices: list[dict]) -> dict:
        out = shapes.envelope(chat, rid, created, req.model, choices, chunk=True)
        out["usage"] = None
        return out

    try:
        if chat:
            for i in range(len(handles)):
                yield _sse(chunk([shapes.choice(True, i, "", None, ids_or_none([]), delta=True, first=True)]))
        remaining = len(tasks)
        completion_tokens = 0
        while remaining:
            index, delta, payload, logprobs = await events.get()
            if delta is not None:
                yield _sse(chunk([shapes.choice(chat, index, delta, None, ids_or_none(payload), delta=True,
                                                logprobs=logprobs)]))
                continue
            result: _ChoiceResult = payload
            remaining -= 1
            completion_tokens += len(result.token_ids)
            if result.finish_reason == "error":
                yield _sse(error_body(f"generation failed: {result.error}", "server_error", None, "engine_error"))
                continue
            last = chunk([shapes.choice(chat, index, "", result.finish_reason, ids_or_none([]), delta=True)])
            if remaining == 0:  # the final chunk carries the request's speculation metrics
                last["metrics"] = server.spec_metrics(handles, req.params)
            yield _sse(last)
        if req.include_usage:
            tail = chunk([])
            tail["usage"] = shapes.usage(sum(map(len, req.prompts)), completion_tokens, _cached_tokens(handles))
            tail["metrics"] = server.spec_metrics(handles, req.params)
            yield _sse(tail)
        yield "data: [DONE]\n\n"
    finally:
        # Normal end: nothing left to cancel. Client gone (the generator is closed or cancelled): free the KV.
        _cancel_unfinished(handles)


def create_app(llm, config: ServeConfig | None = None, shutdown_llm: bool = False) -> Starlette:
    """The OpenAI-compatible app over ``llm`` (its engine loop starts now; ``shutdown_llm``: stop it with the app)."""
    server = OpenAIServer(llm, config)

    def endpoint(fn):
        async def wrapped(request: Request) -> Response:
            try:
                return await fn(request)
            except APIError as exc:
                return _error_response(exc)
            except Exception:  # never a traceback to the client; the log has it
                log.exception("unhandled error in %s %s", request.method, request.url.path)
                return _error_response(APIError("internal server error", status=500, type="server_error"))
        return wrapped

    @endpoint
    async def completions(request: Request) -> Response:
        return await _generate(server, request, chat=False)

    @endpoint
    async def chat_completions(request: Request) -> Response:
        return await _generate(server, request, chat=True)

    @endpoint
    async def models(request: Request) -> Response:
        server.check_auth(request)
        return JSONResponse(server.model_list())

    async def health(request: Request) -> Response:
        if server.loop.alive:
            return JSONResponse({"status": "ok"})
        return _error_response(APIError("the engine loop is not running", status=503, type="server_error"))

    async def metrics(request: Request) -> Response:
        return Response(server.metrics.render(), media_type=CONTENT_TYPE)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(f"{request.method} {request.url.path}: {exc.detail}", kind),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    async def server_error(request: Request, exc: Exception) -> Response:
        return _error_response(APIError("internal server error", status=500, type="server_error"))

    @asynccontextmanager
    async def lifespan(app):
        yield
        if shutdown_llm:
            llm.shutdown()

    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/health", health, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error, Exception: server_error})
    app.state.openai_server = server
    return app


def warm_up(llm) -> None:
    """One short RecGuide request through the engine loop, so the first client does not pay for the cost table."""
    from ..runtime.params import SamplingParams

    prompt = "def main():\n" if llm.tokenizer is not None else [llm.config.vocab_size - 1] * 4
    req = llm.submit(prompt, SamplingParams(max_tokens=2, policy="recguide")).result()
    if req.error:
        raise RuntimeError(f"warm-up request failed: {req.error}")
