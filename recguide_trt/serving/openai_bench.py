"""Closed-loop sweep through ``recguide serve`` (or any OpenAI-compatible server): ``recguide bench --openai URL``.

Each client streams /v1/completions (server-sent events) with httpx; timings are client-side (TTFT:
send → first text chunk; ITL between chunks; tok/s from ``usage``), and the server's speculation
figures come from the final chunk's ``metrics.speculative_decoding`` when the server sends them.
The loop and the summary are shared with the Triton sweep (:mod:`.client_sweep`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from .client_sweep import run_closed_loop, summarize, timing_record


def _one_request(http, body: dict) -> dict:
    t_send = time.perf_counter()
    chunk_times: list[float] = []
    usage, spec = None, None
    try:
        with http.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return {"error": f"HTTP {r.status_code}: {r.read().decode(errors='replace')[:300]}", "send": t_send}
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    return {"error": data["error"].get("message"), "send": t_send}
                if any(c.get("text") for c in data.get("choices") or []):
                    chunk_times.append(time.perf_counter())
                usage = data.get("usage") or usage
                spec = (data.get("metrics") or {}).get("speculative_decoding") or spec
    except Exception as exc:  # a transport error is one failed request, not the end of the sweep
        return {"error": f"{type(exc).__name__}: {exc}", "send": t_send}
    end = time.perf_counter()
    n = usage["completion_tokens"] if usage else len(chunk_times)
    server = {}
    if spec:
        server = {"mal": spec.get("mean_acceptance_length"), "draft_tokens": spec.get("num_draft_tokens"),
                  "accepted_draft_tokens": spec.get("num_accepted_draft_tokens"),
                  "forwards": sum((spec.get("forwards") or {}).values()) or None}
    return timing_record(t_send, chunk_times, end, n, **server)


def run_openai_sweep(url: str, prompts: Sequence[str], concurrencies: Sequence[int], max_tokens: int = 64,
                     policy: str = "recguide", temperature: float = 0.0, top_p: float = 1.0,
                     requests_per_level: int | None = None, model: str | None = None, api_key: str | None = None,
                     timeout: float = 600.0, warmup: int = 1) -> list[dict]:
    """Closed-loop sweep against ``url`` (``http://host:port``); one summary dict per concurrency."""
    import httpx

    if not prompts:
        raise ValueError("prompts is empty")
    if any(int(c) < 1 for c in concurrencies):
        raise ValueError(f"concurrencies must be >= 1, got {list(concurrencies)}")
    base = url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def body(i: int) -> dict:
        b = {"prompt": prompts[i % len(prompts)], "max_tokens": max_tokens, "temperature": temperature,
             "top_p": top_p, "policy": policy, "stream": True, "stream_options": {"include_usage": True}}
        if model:
            b["model"] = model
        return b

    def make_client():
        return httpx.Client(base_url=base, headers=headers, timeout=timeout)

    with make_client() as http:
        for i in range(warmup):
            r = _one_request(http, body(i))
            if r["error"]:
                raise RuntimeError(f"warm-up request failed: {r['error']}")
    rows = []
    for C in concurrencies:
        C = int(C)
        total = requests_per_level or max(2 * C, len(prompts))
        records, wall = run_closed_loop(C, total, make_client, lambda http, i: _one_request(http, body(i)),
                                        lambda http: http.close())
        rows.append(summarize(records, C, policy, wall))
    return rows
