#!/usr/bin/env python3
"""What sampling costs against greedy decoding: output tokens per second of each policy, interleaved.

The same prompts (the held-out chat + code workload) run greedy and sampled (``--temperature``, ``--top-p``,
seeded per prompt), one request at a time (batch 1) and all at once (``--batch``), the two modes alternating
which goes first in every round. A sampled token is drawn on the host from the position's probabilities, and a
speculative round draws or scores about two per block position, so this is where the host's sampling code shows.
MAL (accepted tokens per verify round) is reported too: under sampling a draft is accepted by the p/q test.

    python scripts/bench_sampling.py --rounds 3 --out docs/bench/sampling
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from recguide_trt.bench.paired_modes import add_arguments, check_counts

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap, "ar,linearspec,recguide")
    ap.add_argument("--temperature", type=float, default=0.7, help="sampled mode's temperature (default 0.7)")
    ap.add_argument("--top-p", type=float, default=0.9, help="sampled mode's top_p (default 0.9)")
    a = ap.parse_args(argv)
    check_counts(ap, a)
    if not a.temperature > 0:
        ap.error(f"--temperature must be > 0 (the sampled mode), got {a.temperature}")
    if not 0 < a.top_p <= 1:
        ap.error(f"--top-p must be in (0, 1], got {a.top_p}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    from recguide_trt import LLM, SamplingParams
    from recguide_trt.bench.outputs import write_table_and_results
    from recguide_trt.bench.paired_modes import paired_rows, policy_list, request_cases, run_interleaved
    from recguide_trt.bench.peers.machine import machine_line, record_start

    policies = policy_list(a.policies, "bench_sampling.py")
    rec = record_start(REPO, ["scripts/bench_sampling.py", *(sys.argv[1:] if argv is None else argv)])
    llm = LLM(a.model, backend=a.backend, max_num_seqs=max(a.batch, 1))
    workload, cases = request_cases(llm, a.serial_prompts, a.batch)
    modes = {"greedy": {}, "sampled": {"temperature": a.temperature, "top_p": a.top_p}}

    def run(groups, policy, mode):
        t0, outs, seed = time.perf_counter(), [], 0
        for g in groups:
            params = [SamplingParams(max_tokens=a.max_tokens, policy=policy, seed=(seed := seed + 1), **modes[mode])
                      for _ in g]
            outs += llm.generate(g, params)
        return time.perf_counter() - t0, outs

    mal: dict = {}

    def record_mal(rnd, case, policy, got):
        for mode, outs in got.items():
            rounds = sum(o.metrics.rounds for o in outs)
            mal.setdefault((case, policy, mode), []).append(
                sum(o.metrics.decode_tokens for o in outs) / rounds if rounds else 1.0)

    for policy in policies:  # warm-up: the step-cost table, the thread pool, the KV pages
        run([cases["batch 1"][0]], policy, "sampled")
    tok_s = run_interleaved(cases, policies, list(modes), a.rounds, run, record_mal)

    rec["loadavg_end"] = list(os.getloadavg())
    rows = paired_rows(tok_s, cases, policies, "greedy", "sampled")
    for r in rows:
        for mode in modes:
            r[f"mal_{mode}"] = statistics.mean(mal[(r["case"], r["policy"], mode)])
    lines = [f"# Sampling against greedy: output tok/s, {a.model}", "", f"Machine: {machine_line(rec)}", "",
             f"Command: `{rec['command']}`", "",
             f"{workload} prompts, {a.max_tokens} tokens each, backend {llm.backend_name}; sampled = temperature "
             f"{a.temperature}, top_p {a.top_p}, seeded per prompt; the modes alternate in each of {a.rounds} rounds.",
             "", "| case | policy | tok/s greedy (best) | tok/s sampled (best) | sampled / greedy (median of rounds) "
             "| MAL greedy | MAL sampled |", "|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['case']} | {r['policy']} | {r['tok_s_greedy']:.1f} | {r['tok_s_sampled']:.1f} | "
              f"{r['ratio_median']:.3f} | {r['mal_greedy']:.2f} | {r['mal_sampled']:.2f} |" for r in rows]
    md = "\n".join(lines) + "\n"
    print("\n" + md)
    write_table_and_results(a.out, md, {"machine": rec, "model": a.model, "backend": llm.backend_name,
                                        "temperature": a.temperature, "top_p": a.top_p, "max_tokens": a.max_tokens,
                                        "rows": rows})
    llm.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
