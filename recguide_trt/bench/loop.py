"""The closed-loop driver shared by the real sweep and the simulator.

C clients; each sends its next request the moment its previous one finishes. One cell =

* warm-up: every client's first request is excluded from the figures; their lengths are
  staggered (client i asks for ``ceil(max_tokens · (i+1) / C)`` tokens) so the clients leave the
  warm-up out of phase instead of all prefilling together each time;
* measured: the next ``n_measured`` requests (what every per-request metric is computed on);
* fillers: once all measured requests are submitted, clients keep sending (unmeasured) requests
  so that exactly C stay in flight until the last measured one finishes; then fillers are cancelled.

The engine is stepped on the caller's thread (no thread jitter): after each step finished
requests are replaced, and the next step admits the replacements. The aggregate throughput of
the cell is measured over the steady window [first measured arrival, last measured finish],
counting every token emitted inside it (measured, warm-up and filler requests alike): exactly C
requests are in flight the whole window, so this is the closed-loop throughput at concurrency C.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from ..runtime.metrics import aggregate
from ..runtime.params import SamplingParams
from ..runtime.request import Request


class Target(Protocol):
    """What the driver needs from an engine (the runtime's Engine or the simulator's)."""

    def submit(self, prompt_ids: list[int], params: SamplingParams, on_tokens=None) -> Request: ...

    def step(self) -> None: ...

    def cancel(self, request_id: int) -> None: ...

    def has_work(self) -> bool: ...


@dataclass
class CellResult:
    """Everything measured in one (policy, C) cell."""

    label: str
    concurrency: int
    metrics: dict
    """``runtime.metrics.aggregate`` of the measured requests (DESIGN.md §5)."""
    throughput: dict
    """Closed-loop aggregate throughput over the steady window (all requests' tokens)."""
    inflight: dict
    """Min / max requests in flight after each refill while measured requests were pending."""
    failed: int
    requests: list[Request] = field(default_factory=list, repr=False)
    """Measured requests (for traces and per-request figures)."""
    kinds: dict[int, str] = field(default_factory=dict, repr=False)
    """Request id -> "warmup" | "measured" | "filler" (every request of the cell)."""
    prompt_index: dict[int, int] = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict:
        return {"policy": self.label, "C": self.concurrency, "metrics": self.metrics,
                "throughput": self.throughput, "inflight": self.inflight, "failed": self.failed}


def steady_throughput(all_requests: list[Request], measured: list[Request]) -> dict:
    """Tokens emitted by any request inside [first measured arrival, last measured finish] / window."""
    done = [r for r in measured if r.metrics.finish_time is not None]
    if not done:
        return {"output_tok_s": None, "window_s": 0.0, "tokens": 0}
    t0 = min(r.metrics.arrival for r in done)
    t1 = max(r.metrics.finish_time for r in done)
    tokens = sum(1 for r in all_requests for t in r.metrics.token_times if t0 <= t <= t1)
    window = t1 - t0
    return {"output_tok_s": tokens / window if window > 0 else None, "window_s": window, "tokens": tokens}


class Cell:
    """One closed-loop cell, stepped by its caller: :func:`run_cell` steps one to its end; the step-interleaved
    sweep (:mod:`.step_interleave`) steps several, each on its own engine, in turns.

    Constructing it submits the first C requests; :meth:`advance` runs one engine step and replaces the
    requests that finished; once :attr:`done`, :meth:`finish` cancels what is left and returns the figures."""

    def __init__(self, target: Target, prompts: list[list[int]], make_params: Callable[[int], SamplingParams],
                 concurrency: int, n_measured: int, max_tokens: int, label: str = "", warmup: bool = True,
                 on_finish: Callable[[Request, str], None] | None = None, max_steps: int = 10**7):
        if concurrency < 1 or n_measured < 1:
            raise ValueError("concurrency and n_measured must be >= 1")
        self.target, self.prompts, self.make_params = target, prompts, make_params
        self.concurrency, self.n_measured, self.max_tokens = concurrency, n_measured, max_tokens
        self.label, self.on_finish, self.max_steps = label, on_finish, max_steps
        self.next_prompt = 0
        self.kinds: dict[int, str] = {}
        self.prompt_index: dict[int, int] = {}
        self.all_reqs: list[Request] = []
        self.measured: list[Request] = []
        self.steps = 0
        self.done = False
        self.clients: list[Request] = []
        for i in range(concurrency):
            if warmup:
                self.clients.append(self._submit("warmup", max(1, math.ceil(max_tokens * (i + 1) / concurrency))))
            else:
                self.clients.append(self._refill())
        self.lo = self.hi = concurrency

    def _submit(self, kind: str, tokens: int) -> Request:
        idx = self.next_prompt % len(self.prompts)
        self.next_prompt += 1
        r = self.target.submit(self.prompts[idx], self.make_params(tokens))
        self.kinds[r.id] = kind
        self.prompt_index[r.id] = idx
        self.all_reqs.append(r)
        if kind == "measured":
            self.measured.append(r)
        return r

    def _refill(self) -> Request:
        return self._submit("measured" if len(self.measured) < self.n_measured else "filler", self.max_tokens)

    def advance(self) -> None:
        """One engine step; then the finished clients send their next requests (or the cell is done)."""
        if self.done:
            raise RuntimeError(f"cell {self.label} C={self.concurrency} is done")
        self.target.step()
        self.steps += 1
        if self.steps > self.max_steps:
            raise RuntimeError(f"cell {self.label} C={self.concurrency} did not finish in {self.max_steps} steps")
        finished = [i for i, r in enumerate(self.clients) if r.done]
        if self.on_finish is not None:
            for i in finished:
                self.on_finish(self.clients[i], self.kinds[self.clients[i].id])
        if len(self.measured) >= self.n_measured and all(r.done for r in self.measured):
            self.done = True
            return
        for i in finished:
            self.clients[i] = self._refill()
        inflight = sum(not r.done for r in self.clients)
        self.lo, self.hi = min(self.lo, inflight), max(self.hi, inflight)

    def finish(self) -> CellResult:
        """Cancel the fillers still running, step the engine idle, and return the cell's figures."""
        for r in self.clients:
            if not r.done:
                self.target.cancel(r.id)
        while self.target.has_work():
            self.target.step()
        failed = sum(r.finish_reason == "error" for r in self.measured)
        return CellResult(self.label, self.concurrency, aggregate([r.metrics for r in self.measured]),
                          steady_throughput(self.all_reqs, self.measured), {"min": self.lo, "max": self.hi},
                          failed, self.measured, self.kinds, self.prompt_index)


def run_cell(target: Target, prompts: list[list[int]], make_params: Callable[[int], SamplingParams],
             concurrency: int, n_measured: int, max_tokens: int, label: str = "", warmup: bool = True,
             on_finish: Callable[[Request, str], None] | None = None, max_steps: int = 10**7) -> CellResult:
    """Run one closed-loop cell on ``target`` (which must be idle) and return its figures."""
    cell = Cell(target, prompts, make_params, concurrency, n_measured, max_tokens, label, warmup, on_finish,
                max_steps)
    while not cell.done:
        cell.advance()
    return cell.finish()


@contextmanager
def record_rounds(policies: dict, sink: dict[int, list]):
    """Record every verify round (block, accepted, predicted cut, hit) per request id.

    Wraps each policy instance's ``observe`` (an instance attribute shadowing the method, removed
    on exit); ``request.draft`` is still the verified draft when ``observe`` runs.
    """
    wrapped = []
    for pol in policies.values():
        inner = pol.observe

        def observe(request, outcome, hit, would_hit=None, _inner=inner):
            flag = request.draft.flag.position if request.draft is not None else -1
            sink.setdefault(request.id, []).append(
                [int(outcome.block), int(outcome.accepted), int(flag), None if hit is None else int(hit)])
            return _inner(request, outcome, hit, would_hit)

        pol.observe = observe
        wrapped.append(pol)
    try:
        yield sink
    finally:
        for pol in wrapped:
            del pol.observe

