"""How the control endpoints answer while every slot of a server is busy (``scripts/probe_endpoints.py``).

Sends ``requests`` long completions (as many as the server has slots) and waits until they all run. It then
times ``GET /health``, ``/v1/models`` and ``/metrics``, one after the other, and reads the running requests
each scrape shows. A server whose control endpoints wait for a free slot answers only after a request has
ended, and its scrape then shows fewer running requests than ``requests``. Ray Serve replicas did so before
their reports (:mod:`.ray_board`). The requests are then cancelled.

Works against ``recguide serve`` and ``recguide serve --ray`` alike (and any OpenAI-compatible server that
serves vLLM's ``vllm:num_requests_running``).
"""

from __future__ import annotations

import asyncio
import time

PATHS = ("/health", "/v1/models", "/metrics")


def running_per_replica(metrics_text: str) -> dict[str, float]:
    """``vllm:num_requests_running`` of each replica in a scrape (``""``: a server without replicas)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {s.labels.get("replica", ""): s.value for fam in text_string_to_metric_families(metrics_text)
            for s in fam.samples if s.name == "vllm:num_requests_running"}


async def probe_at_full_load(url: str, requests: int, model: str, max_tokens: int = 1900, api_key: str = "unused",
                             settle_s: float | None = None, start_timeout_s: float = 120.0,
                             probe_timeout_s: float = 60.0) -> dict:
    """Each probe's status, seconds and (for /metrics) running requests by replica, with every slot busy.

    The requests are not streamed, so that the proxy and ingress carry nothing while the probes run. Full load is
    a scrape showing ``requests`` running (each poll gets 2 s); ``settle_s`` instead just waits that long, for
    a server whose scrape cannot show it. ``requests_ended``: the requests that had ended when each probe
    answered (0 for an answer that did not wait for a slot, as long as ``max_tokens`` outlasts the probes).
    """
    import httpx
    import openai

    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    ended: list[int] = []

    async def generate(client, i: int) -> None:
        try:
            await client.completions.create(model=model, prompt=f"def f{i}(x):", max_tokens=max_tokens, temperature=0,
                                            extra_body={"policy": "ar", "ignore_eos": True})
        finally:
            ended.append(i)

    async def full(http) -> dict[str, float]:
        deadline, running = time.monotonic() + start_timeout_s, {}
        while time.monotonic() < deadline:
            failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
            if failed:
                raise RuntimeError(f"a request failed before every slot was busy: {failed[0].exception()!r}")
            try:
                running = running_per_replica((await http.get("/metrics", timeout=2.0)).text)
                if sum(running.values()) >= requests:
                    return running
            except httpx.TimeoutException:
                pass
            await asyncio.sleep(0.1)
        raise RuntimeError(f"the server never showed {requests} requests running in {start_timeout_s:g} s (last "
                           f"scrape: {running}); a scrape that waits for a free slot never does: use settle_s")

    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=600) as client, \
            httpx.AsyncClient(base_url=url, timeout=probe_timeout_s,
                              headers={"Authorization": f"Bearer {api_key}"}) as http:
        tasks = [asyncio.create_task(generate(client, i)) for i in range(requests)]
        try:
            if settle_s is None:
                await full(http)
            else:
                await asyncio.sleep(settle_s)
            probes = []
            for path in PATHS:
                t0 = time.monotonic()
                r = await http.get(path)
                probe = {"path": path, "status": r.status_code, "seconds": time.monotonic() - t0,
                         "requests_ended": len(ended)}
                if path == "/metrics" and r.status_code == 200:
                    probe["running"] = running_per_replica(r.text)
                probes.append(probe)
            return {"url": url, "requests": requests, "max_tokens": max_tokens, "settle_s": settle_s,
                    "probes": probes}
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
