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


def run_cell(target: Target, prompts: list[list[int]], make_params: Callable[[int], SamplingParams],
             concurrency: int, n_measured: int, max_tokens: int, label: str = "", warmup: bool = True,
             on_finish: Callable[[Request, str], None] | None = None, max_steps: int = 10**7) -> CellResult:
    """Run one closed-loop cell on ``target`` (which must be idle) and return its figures."""
    if concurrency < 1 or n_measured < 1:
        raise ValueError("concurrency and n_measured must be >= 1")
    next_prompt = 0
    kinds: dict[int, str] = {}
    prompt_index: dict[int, int] = {}
    all_reqs: list[Request] = []
    measured: list[Request] = []
    submitted_measured = 0

    def submit(kind: str, tokens: int) -> Request:
        nonlocal next_prompt, submitted_measured
        idx = next_prompt % len(prompts)
        next_prompt += 1
        r = target.submit(prompts[idx], make_params(tokens))
        kinds[r.id] = kind
        prompt_index[r.id] = idx
        all_reqs.append(r)
        if kind == "measured":
            measured.append(r)
            submitted_measured += 1
        return r

    def refill() -> Request:
        if submitted_measured < n_measured:
            return submit("measured", max_tokens)
        return submit("filler", max_tokens)

    clients: list[Request] = []
    for i in range(concurrency):
        if warmup:
            clients.append(submit("warmup", max(1, math.ceil(max_tokens * (i + 1) / concurrency))))
        else:
            clients.append(refill())
    lo, hi = concurrency, concurrency
    steps = 0
    while True:
        target.step()
        steps += 1
        if steps > max_steps:
            raise RuntimeError(f"cell {label} C={concurrency} did not finish in {max_steps} steps")
        finished = [i for i, r in enumerate(clients) if r.done]
        for i in finished:
            if on_finish is not None:
                on_finish(clients[i], kinds[clients[i].id])
        if submitted_measured >= n_measured and all(r.done for r in measured):
            break
        for i in finished:
            clients[i] = refill()
        inflight = sum(not r.done for r in clients)
        lo, hi = min(lo, inflight), max(hi, inflight)
    for r in clients:
        if not r.done:
            target.cancel(r.id)
    while target.has_work():
        target.step()
    failed = sum(r.finish_reason == "error" for r in measured)
    return CellResult(label, concurrency, aggregate([r.metrics for r in measured]),
                      steady_throughput(all_reqs, measured), {"min": lo, "max": hi}, failed, measured, kinds,
                      prompt_index)


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

