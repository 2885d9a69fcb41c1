"""The client side of a closed-loop sweep through a server (Triton or OpenAI): drive C clients, summarise.

C client threads each send a request, wait for its end, then send the next, until ``total``
requests are done (DESIGN.md §5). A request is timed by the transport's ``one_request`` and
returns a record: ``send``/``first``/``end`` times, ``output_tokens``, ``ttft``, ``e2e``, ``tpot``,
``tok_s``, ``itl`` (between chunks), optional server figures (``mal``, ``draft_tokens``,
``accepted_draft_tokens``, ``forwards``) and ``error``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def _pct(xs, q):
    xs = [x for x in xs if x is not None]
    return float(np.percentile(xs, q)) if xs else None


def run_closed_loop(concurrency: int, total: int, make_client: Callable[[], Any],
                    one_request: Callable[[Any, int], dict], close_client: Callable[[Any], None]) -> tuple[list, float]:
    """Run ``total`` requests through ``concurrency`` clients; returns (records, wall seconds)."""
    counter = iter(range(total))
    lock = threading.Lock()
    records: list[dict] = []

    def client_loop():
        client = make_client()
        try:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                rec = one_request(client, i)
                with lock:
                    records.append(rec)
        finally:
            close_client(client)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records, time.perf_counter() - t0


def summarize(records: list[dict], concurrency: int, policy: str, wall: float) -> dict:
    """One row of the sweep from its requests' records (client-side timings, server figures summed)."""
    ok = [r for r in records if not r["error"]]
    out_tokens = sum(r["output_tokens"] for r in ok)
    itl = [x for r in ok for x in r["itl"]]
    drafted = sum(r.get("draft_tokens") or 0 for r in ok)
    return {
        "concurrency": concurrency, "policy": policy, "requests": len(records), "errors": len(records) - len(ok),
        "output_tokens": out_tokens, "wall_s": wall,
        "output_tok_s": out_tokens / wall if wall > 0 else None,
        "per_request_tok_s": _mean([r["tok_s"] for r in ok]),
        "ttft_mean": _mean([r["ttft"] for r in ok]), "ttft_p99": _pct([r["ttft"] for r in ok], 99),
        "tpot_mean": _mean([r["tpot"] for r in ok]), "e2e_mean": _mean([r["e2e"] for r in ok]),
        "itl_mean": _mean(itl), "itl_p99": _pct(itl, 99),
        "mal_mean": _mean([r.get("mal") for r in ok]),
        "acceptance": (sum(r.get("accepted_draft_tokens") or 0 for r in ok) / drafted) if drafted else None,
        "forwards": sum(r.get("forwards") or 0 for r in ok),
        "first_error": next((r["error"] for r in records if r["error"]), None),
        "requests_detail": [{k: v for k, v in r.items() if k != "itl"} for r in records],
    }


def timing_record(t_send: float, chunk_times: list[float], end: float, n: int, **server) -> dict:
    """The client-side timing fields of one finished request (``chunk_times``: arrivals of text chunks)."""
    first = chunk_times[0] if chunk_times else end
    last = chunk_times[-1] if chunk_times else end
    return {"send": t_send, "first": first, "end": end, "output_tokens": n, "ttft": first - t_send,
            "e2e": end - t_send, "tpot": (end - first) / (n - 1) if n > 1 else None,
            "tok_s": n / (last - first) if n > 1 and last > first else None,
            "itl": [b - a for a, b in zip(chunk_times, chunk_times[1:])], "error": None, **server}
