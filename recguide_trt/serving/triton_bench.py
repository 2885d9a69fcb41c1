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
import threading
import time
from collections.abc import Sequence

import numpy as np

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

            first = chunk_times[0] if chunk_times else now
            last = chunk_times[-1] if chunk_times else now
            return {"send": t_send, "first": first, "end": now, "output_tokens": n,
                    "ttft": first - t_send, "e2e": now - t_send,
                    "tpot": (now - first) / (n - 1) if n > 1 else None,
                    "tok_s": n / (last - first) if n > 1 and last > first else None,
                    "itl": [b - a for a, b in zip(chunk_times, chunk_times[1:])],
                    "mal": scalar("mal"), "forwards": scalar("forwards"), "draft_tokens": scalar("draft_tokens"),
                    "accepted_draft_tokens": scalar("accepted_draft_tokens"), "error": None}


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def _pct(xs, q):
    xs = [x for x in xs if x is not None]
    return float(np.percentile(xs, q)) if xs else None


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
        counter = iter(range(total))
        lock = threading.Lock()
        records: list[dict] = []

        def client_loop(counter=counter, lock=lock, records=records):
            client, q = make_client()
            try:
                while True:
                    with lock:
                        i = next(counter, None)
                    if i is None:
                        return
                    rec = _one_request(client, q, _inputs(grpcclient, prompts[i % len(prompts)], **args), model,
                                       timeout)
                    with lock:
                        records.append(rec)
            finally:
                client.stop_stream()
                client.close()

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(C)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        ok = [r for r in records if not r["error"]]
        out_tokens = sum(r["output_tokens"] for r in ok)
        itl = [x for r in ok for x in r["itl"]]
        drafted = sum(r["draft_tokens"] or 0 for r in ok)
        rows.append({
            "concurrency": C, "policy": policy, "requests": len(records), "errors": len(records) - len(ok),
            "output_tokens": out_tokens, "wall_s": wall,
            "output_tok_s": out_tokens / wall if wall > 0 else None,
            "per_request_tok_s": _mean([r["tok_s"] for r in ok]),
            "ttft_mean": _mean([r["ttft"] for r in ok]), "ttft_p99": _pct([r["ttft"] for r in ok], 99),
            "tpot_mean": _mean([r["tpot"] for r in ok]), "e2e_mean": _mean([r["e2e"] for r in ok]),
            "itl_mean": _mean(itl), "itl_p99": _pct(itl, 99),
            "mal_mean": _mean([r["mal"] for r in ok]),
            "acceptance": (sum(r["accepted_draft_tokens"] or 0 for r in ok) / drafted) if drafted else None,
            "forwards": sum(r["forwards"] or 0 for r in ok),
            "first_error": next((r["error"] for r in records if r["error"]), None),
            "requests_detail": [{k: v for k, v in r.items() if k != "itl"} for r in records],
        })
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
