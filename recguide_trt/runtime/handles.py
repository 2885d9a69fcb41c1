"""A background step loop over an :class:`Engine`, and per-request handles that stream tokens."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Iterator

from .engine import Engine
from .params import SamplingParams
from .request import Request

_END = object()


class RequestHandle:
    """Streams one request's tokens: ``for ids in handle`` / ``async for ids in handle``; ``result()``."""

    def __init__(self, loop: EngineLoop):
        self._loop = loop
        self._queue: queue.Queue = queue.Queue()
        self.request: Request | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._async: tuple[asyncio.AbstractEventLoop, asyncio.Queue] | None = None
        """Set by ``async for``: items then go straight to the consumer's event loop (no thread per wait)."""

    def _put(self, item) -> None:
        with self._lock:
            if self._async is None:
                self._queue.put(item)
                return
            loop, aq = self._async
        try:
            loop.call_soon_threadsafe(aq.put_nowait, item)
        except RuntimeError:  # the consumer's event loop is closed: nobody is listening any more
            pass

    def _on_tokens(self, request: Request, tokens: list[int]) -> None:
        if tokens:
            self._put(list(tokens))
        if request.done:
            self._put(_END)
            self._done.set()

    @property
    def id(self) -> int:
        return self.request.id

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            yield item

    async def __aiter__(self) -> AsyncIterator[list[int]]:
        # The engine thread hands items to this event loop (call_soon_threadsafe) rather than a worker
        # thread blocking per wait: a server streams many requests at once, and the default thread
        # pool has only a few workers.
        aq: asyncio.Queue = asyncio.Queue()
        with self._lock:
            while True:
                try:
                    aq.put_nowait(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._async = (asyncio.get_running_loop(), aq)
        while True:
            item = await aq.get()
            if item is _END:
                return
            yield item

    def result(self, timeout: float | None = None) -> Request:
        """Wait for the request to end and return its final state."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} still running after {timeout} s")
        return self.request

    def cancel(self) -> None:
        self._loop.cancel(self)


class EngineLoop:
    """Runs ``engine.step()`` on a daemon thread while there is work; ``submit`` from any thread."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._wake = threading.Event()
        self._stop = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="recguide-engine", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: list[int], params: SamplingParams, on_tokens=None) -> RequestHandle:
        """``on_tokens(request, tokens)``, when given, sees each batch of tokens on the engine thread before the
        handle does (``LLM.generate`` watches for stop strings there)."""
        handle = RequestHandle(self)

        def both(request: Request, tokens: list[int]) -> None:
            on_tokens(request, tokens)
            handle._on_tokens(request, tokens)

        handle.request = self.engine.submit(prompt_ids, params,
                                            on_tokens=handle._on_tokens if on_tokens is None else both)
        self._wake.set()
        return handle

    def cancel(self, handle: RequestHandle) -> None:
        self.engine.cancel(handle.id)
        self._wake.set()

    @property
    def alive(self) -> bool:
        """The step thread is running (it survives failed steps; it ends only at shutdown)."""
        return self._thread.is_alive() and not self._stop

    def _run(self) -> None:
        while not self._stop:
            if not self.engine.has_work():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                self.engine.step()
            except BaseException as exc:  # keep serving; surface the error to every live request
                self.error = exc
                for r in list(self.engine.running) + list(self.engine.waiting):
                    self.engine._fail(r, f"engine step failed: {exc!r}")
                self.engine._retire()
                self.engine.waiting.clear()

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)
