"""Run an ASGI app on one HTTP request as an async generator of the messages it sends.

Why: a Ray Serve engine replica runs the very app of ``recguide serve`` (``openai_app.create_app``)
on requests that arrived somewhere else (the ingress replica, another process or node). The request
crosses as a picklable scope and its body; the app's ``send`` messages come back as batches of
plain dicts, which the ingress replays to its client. Every endpoint, field and error of the
single-process server is therefore the same code on a replica, not a copy of it.

The generator's consumer going away (the ingress cancels it when its client disconnects) is the
app's ``http.disconnect``: the app cancels its requests and their KV slots are freed, as in the
single-process server. Nothing here knows Ray.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

log = logging.getLogger(__name__)

SCOPE_KEYS = ("type", "http_version", "method", "scheme", "path", "raw_path", "query_string", "root_path",
              "client", "server")
"""The parts of an HTTP scope an app may read that survive pickling (no app, router, state or extensions)."""


def portable_scope(scope: dict) -> dict:
    """A picklable copy of an HTTP ``scope``; ASGI spec 2.3, so Starlette listens for the disconnect."""
    out = {k: scope[k] for k in SCOPE_KEYS if k in scope}
    out["headers"] = [(bytes(k), bytes(v)) for k, v in scope.get("headers", [])]
    out["asgi"] = {"version": "3.0", "spec_version": "2.3"}
    for k in ("client", "server"):
        if out.get(k) is not None:
            out[k] = tuple(out[k])
    return out


_END = object()
_background: set[asyncio.Task] = set()
"""Apps still finishing a request whose consumer left (kept referenced until they end)."""


async def run_asgi(app, scope: dict, body: bytes) -> AsyncIterator[list[dict]]:
    """Run ``app`` on one request; yield its ``send`` messages in batches (whatever queued since the last yield).

    Batching is what keeps a fast stream from costing one cross-process message per token when the
    consumer is slower than the engine. An exception of the app is logged here, as uvicorn would;
    the consumer sees a response without its last body message and answers the error itself.
    """
    queue: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    body_sent = False

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if not gone.is_set():
            await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if gone.is_set():
            raise OSError("the client disconnected")
        queue.put_nowait(message)

    async def run() -> None:
        try:
            await app(scope, receive, send)
        except Exception:
            log.exception("the app failed on %s %s", scope.get("method"), scope.get("path"))
        finally:
            queue.put_nowait(_END)

    task = asyncio.create_task(run())
    finished = False
    try:
        while not finished:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            if batch[-1] is _END:
                batch.pop()
                finished = True
            if batch:
                yield batch
    finally:
        if not task.done():   # the consumer left mid-response: tell the app, let it clean up on its own
            gone.set()
            _background.add(task)
            task.add_done_callback(_background.discard)
