"""Closed-loop concurrency sweep through a Triton server (tritonclient gRPC streaming).

For each concurrency C: C clients, each with its own gRPC stream, send a request, wait for its
final response, then send the next (DESIGN.md §5), until ``requests_per_level`` requests are done.
All timings are client-side: TTFT (send → first text chunk), ITL (between chunks), per-request
tok/s (output tokens / (last − first chunk)), TPOT ((e2e − TTFT) / (n − 1)); the server's MAL,
draft/accepted tokens and forwards come from the final response. ``recguide bench --triton URL``
prints these rows.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Sequence

import numpy as np

from .client_sweep import run_closed_loop, summarize, timing_record

MODEL_NAME = "recguide"


def _inputs(grpcclient, text: str, max_tokens: int, policy: str, temperature: float, top_p: float,
            seed: int | None, block_size: int | None) -> list:
    values = [("text_input", "BYTES", np.array([text.encode("utf-8")], dtype=np.object_)),
              ("max_tokens", "INT32", np.array([max_tokens], np.int32)),
              ("policy", "BYTES", np.array([policy.encode()], dtype=np.object_)),
              ("temperature", "FP32", np.array([temperature], np.float32)),
              ("top_p", "FP32", np.array([top_p], np.float32)),
              ("stream", "BOOL", np.array([True]))]
    if seed is not None:
        values.append(("seed", "INT64", np.array([seed], np.int64)))
    if block_size is not None:
        values.append(("block_size", "INT32", np.array([block_size], np.int32)))
    out = []
    for name, dtype, arr in values:
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def _one_request(client, q: queue.Queue, inputs: list, model: str, timeout: float) -> dict:
    t_send = time.perf_counter()
    client.async_stream_infer(model, inputs, enable_empty_final_response=True)
    chunk_times: list[float] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            result, error = q.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            return {"error": f"no final response within {timeout} s", "send": t_send}
        now = time.perf_counter()
        if error is not None:
            return {"error": str(error), "send": t_send}
        text = result.as_numpy("text_output")
        if text is not None and text.size and text[0]:
            chunk_times.append(now)
        if result.get_response().parameters["triton_final_response"].bool_param:
            ids = result.as_numpy("output_token_ids")
            n = int(ids.size) if ids is not None else 0

            def scalar(name, result=result):
                v = result.as_numpy(name)
                return None if v is None else v.reshape(-1)[0].item()

            return timing_record(t_send, chunk_times, now, n, mal=scalar("mal"), forwards=scalar("forwards"),
                                 draft_tokens=scalar("draft_tokens"),
                                 accepted_draft_tokens=scalar("accepted_draft_tokens"))


def run_triton_sweep(url: str, prompts: Sequence[str], concurrencies: Sequence[int], max_tokens: int = 64,
                     policy: str = "recguide", temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                     block_size: int | None = None, requests_per_level: int | None = None,
                     model: str = MODEL_NAME, timeout: float = 600.0, warmup: int = 1) -> list[dict]:
    """Closed-loop sweep; one summary dict per concurrency (``"requests_detail"``: per-request rows).

    ``url``: gRPC ``host:port``. ``requests_per_level``: requests per concurrency (default
    ``max(2*C, len(prompts))``); prompts are used round-robin. ``warmup`` requests go first, untimed.
    """
    try:
        import tritonclient.grpc as grpcclient
    except ImportError as exc:  # pragma: no cover - optional extra
        raise ImportError("run_triton_sweep needs tritonclient[grpc] (pip install 'recguide-trt[triton]')") from exc
    if not prompts:
        raise ValueError("prompts is empty")
    if any(int(c) < 1 for c in concurrencies):
        raise ValueError(f"concurrencies must be >= 1, got {list(concurrencies)}")
    args = dict(max_tokens=max_tokens, policy=policy, temperature=temperature, top_p=top_p, seed=seed,
                block_size=block_size)

    def make_client():
        client = grpcclient.InferenceServerClient(url)
        q: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: q.put((result, error)))
        return client, q

    if warmup:
        client, q = make_client()
        try:
            for i in range(warmup):
                r = _one_request(client, q, _inputs(grpcclient, prompts[i % len(prompts)], **args), model, timeout)
                if r["error"]:
                    raise RuntimeError(f"warm-up request failed: {r['error']}")
        finally:
            client.stop_stream()
            client.close()

    rows = []
    for C in concurrencies:
        C = int(C)
        total = requests_per_level or max(2 * C, len(prompts))

        def one(client_q, i):
            client, q = client_q
            return _one_request(client, q, _inputs(grpcclient, prompts[i % len(prompts)], **args), model, timeout)

        def close(client_q):
            client_q[0].stop_stream()
            client_q[0].close()

        records, wall = run_closed_loop(C, total, make_client, one, close)
        rows.append(summarize(records, C, policy, wall))
    return rows


def format_rows(rows: list[dict]) -> str:
    """A plain table of the sweep."""
    head = f"{'C':>4} {'policy':>10} {'req':>5} {'err':>4} {'agg tok/s':>10} {'req tok/s':>10} {'TTFT ms':>8} " \
           f"{'ITL ms':>7} {'MAL':>5}"
    lines = [head]
    for r in rows:
        def f(v, scale=1.0, fmt="{:.1f}"):
            return fmt.format(v * scale) if v is not None else "-"
        lines.append(f"{r['concurrency']:>4} {r['policy']:>10} {r['requests']:>5} {r['errors']:>4} "
                     f"{f(r['output_tok_s']):>10} {f(r['per_request_tok_s']):>10} {f(r['ttft_mean'], 1e3):>8} "
                     f"{f(r['itl_mean'], 1e3, '{:.2f}'):>7} {f(r['mal_mean'], 1.0, '{:.2f}'):>5}")
    return "\n".join(lines)
