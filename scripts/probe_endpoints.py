#!/usr/bin/env python
"""Time GET /health, /v1/models and /metrics of a running server while every one of its slots is busy.

Fills the server with ``--requests`` long completions (its slots: replicas x --max-num-seqs), waits until
/metrics shows them all running (or ``--settle`` seconds), then probes each endpoint once and prints its
status, its seconds, how many requests had ended by then (0 when it did not wait for a slot) and the running
requests the scrape shows. Example (docs/replicas.md)::

    recguide serve --model tiny --ray --replicas 1 --max-num-seqs 2 --max-model-len 2048 --port 8000 &
    python scripts/probe_endpoints.py --url http://127.0.0.1:8000 --requests 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="probe_endpoints.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--requests", type=int, required=True, help="long requests to send: the server's slots in all")
    p.add_argument("--model", default=None, help="served model name (default: the first of GET /v1/models)")
    p.add_argument("--max-tokens", type=int, default=1900, help="tokens per request: long enough to outlast the probes")
    p.add_argument("--settle", type=float, default=None,
                   help="seconds to wait after sending them, instead of waiting for /metrics to show them running "
                        "(for a server whose scrape waits for a free slot)")
    p.add_argument("--api-key", default="unused")
    p.add_argument("--out", default=None, help="write the result as JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.requests < 1:
        raise SystemExit(f"--requests must be >= 1, got {args.requests}")
    if args.settle is not None and args.settle < 0:
        raise SystemExit(f"--settle must be >= 0, got {args.settle}")
    import httpx

    from recguide_trt.bench.peers.machine import cpu_model
    from recguide_trt.serving.endpoint_probe import probe_at_full_load

    url = args.url.rstrip("/")
    model = args.model
    if model is None:
        try:
            r = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {args.api_key}"}, timeout=30)
            r.raise_for_status()
            model = r.json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise SystemExit(f"--url {url}: GET /v1/models gave no model name ({exc}); pass --model") from None
    try:
        result = asyncio.run(probe_at_full_load(url, args.requests, model, max_tokens=args.max_tokens,
                                                api_key=args.api_key, settle_s=args.settle))
    except RuntimeError as exc:
        raise SystemExit(f"--url {url}: {exc}") from None
    result["cpu"], result["load_avg"] = cpu_model(), os.getloadavg()[0]
    how = "after /metrics showed them running" if args.settle is None else f"{args.settle:g} s after sending them"
    print(f"{url}: {args.requests} requests of {args.max_tokens} tokens, probed {how}; CPU {result['cpu']} "
          f"({os.cpu_count()} cores), load {result['load_avg']:.2f}")
    print("| endpoint | status | seconds | requests ended by then | running (scrape) |")
    print("|---|---:|---:|---:|---|")
    for p in result["probes"]:
        running = p.get("running")
        shown = "" if running is None else f"{sum(running.values()):g} " + str(
            {k or "server": v for k, v in sorted(running.items())})
        print(f"| {p['path']} | {p['status']} | {p['seconds']:.2f} | {p['requests_ended']} | {shown} |")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
