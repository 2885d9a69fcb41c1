"""Data-parallel replicas side by side: the same closed-loop load on 1 and on 2 engine replicas (Ray Serve).

``scripts/bench_ray_replicas.py``. One local Ray instance (``--cpus``, this process's own: started
here, stopped at the end), one Ray Serve application; between cells only the engine deployment's
replica count changes (1 ↔ 2, each replica ``--replica-cpus`` CPUs and as many torch threads), in
rotated order per round so drift of a shared machine hits both. Each cell is the OpenAI sweep's
closed loop (:func:`.openai_bench.run_openai_sweep`): C streaming clients through Ray's HTTP proxy
and the ingress, the same requests for both replica counts. Prints output tok/s per cell, the mean
ratio 2 replicas / 1 replica, the requests each replica served, and the machine's CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from ..models.names import MODEL_HELP
from ..runtime.params import POLICIES
from .ports import free_port


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_ray_replicas.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", default="1,2", help="replica counts to compare, comma-separated (default 1,2)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; each runs every replica count once")
    p.add_argument("--concurrency", type=int, default=16, help="closed-loop clients (the same for every cell)")
    p.add_argument("--requests", type=int, default=64, help="requests per cell")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--policy", default="recguide", choices=POLICIES)
    p.add_argument("--cpus", type=int, default=None, help="CPUs of the local Ray instance (default: os.cpu_count())")
    p.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs (and torch threads) per replica")
    p.add_argument("--max-num-seqs", type=int, default=64, help="KV slots per replica")
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--backend", default=None, help="default: the LLM's (native on the CPU)")
    p.add_argument("--out", default=None, help="write every cell as JSON here")
    return p


def _prompts(n: int) -> list[str]:
    return [f"def function_{i}(x{i % 3}):\n    " if i % 2 else f"import os\nclass Widget{i}:\n    " for i in range(n)]


def _replica_counts(url: str) -> dict[str, float]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for s in fam.samples:
            if s.name == "recguide:replica_requests_total":
                out[s.labels["replica"]] = s.value
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    counts = [int(x) for x in args.replicas.split(",") if x.strip()]
    if not counts or min(counts) < 1:
        raise SystemExit(f"--replicas needs replica counts >= 1, got {args.replicas!r}")
    import ray
    from ray import serve

    from ..bench.peers.machine import cpu_model
    from .openai_bench import run_openai_sweep
    from .ray_app import APP_NAME, ReplicaSpec, Topology, build_app

    cpus = args.cpus or os.cpu_count() or 1
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spec = ReplicaSpec(model=args.model, backend=args.backend, max_num_seqs=args.max_num_seqs,
                       threads=max(1, int(args.replica_cpus)))
    prompts = _prompts(max(args.requests, args.concurrency))
    temp = tempfile.mkdtemp(prefix="rgbench-", dir="/tmp")   # short: Ray's socket paths live under it
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray runs its workers (replicas, ingress, proxy) at nice 15; the load generator here runs at 0 and
    # would take the CPU first. Equal footing for a throughput figure (set it yourself to override).
    os.environ.setdefault("RAY_worker_niceness", "0")
    # A local instance on loopback: without this, ray.init() turns on token auth and writes ~/.ray/auth_token,
    # after which every `ray start --head` on this machine enables auth too (and token-less nodes cannot join).
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, _temp_dir=temp)
    cells = []
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for rnd in range(args.rounds):
            order = counts[rnd % len(counts):] + counts[:rnd % len(counts)]
            for n in order:
                t0 = time.perf_counter()
                serve.run(build_app(spec, Topology(replicas=n, replica_cpus=args.replica_cpus)), name=APP_NAME,
                          route_prefix="/")
                ready_s = time.perf_counter() - t0
                before = _replica_counts(url)
                row = run_openai_sweep(url, prompts, [args.concurrency], max_tokens=args.max_tokens,
                                       policy=args.policy, requests_per_level=args.requests)[0]
                after = _replica_counts(url)
                per_replica = sorted(int(after[r] - before.get(r, 0)) for r in after if after[r] > before.get(r, 0))
                row.pop("requests_detail", None)
                cells.append({"round": rnd, "replicas": n, "ready_s": ready_s, "per_replica": per_replica, **row})
                print(f"round {rnd} replicas {n}: {row['output_tok_s']:.1f} output tok/s, TTFT "
                      f"{row['ttft_mean'] * 1e3:.0f} ms, {row['errors']} errors, requests per replica {per_replica}",
                      flush=True)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            shutil.rmtree(temp, ignore_errors=True)
    mean = {n: statistics.mean(c["output_tok_s"] for c in cells if c["replicas"] == n) for n in counts}
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores), Ray instance of {cpus} CPUs, {args.replica_cpus:g} "
          f"CPU(s) and {spec.threads} torch thread(s) per replica; C={args.concurrency}, {args.requests} requests "
          f"x {args.max_tokens} tokens, {args.policy}, {args.rounds} rounds")
    for n in counts:
        print(f"  {n} replica(s): {mean[n]:.1f} output tok/s (mean of {args.rounds})")
    base = counts[0]
    for n in counts[1:]:
        print(f"  ratio {n} / {base} replicas: {mean[n] / mean[base]:.2f}x")
    if args.out:
        Path(args.out).write_text(json.dumps({"cpu": cpu_model(), "cores": os.cpu_count(), "args": vars(args),
                                              "cells": cells, "mean_tok_s": mean}, indent=1))
    return 0
