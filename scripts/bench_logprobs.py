#!/usr/bin/env python3
"""What asking for log-probabilities costs: output tokens per second with and without ``logprobs``, interleaved.

The same prompts (the held-out chat + code workload) run with ``SamplingParams(logprobs=None)`` and with
``logprobs=K``, one request at a time (batch 1) and all at once (``--batch``), for each policy, the two
modes alternating which goes first in every round. Greedy, so both modes must give the same tokens, and
every policy the same log-probabilities as AR: the script checks both and exits 1 if either fails.

``--processors`` measures the logits processors' path instead (``repetition_penalty``, ``logit_bias``, ...: the
rows' full logits to the host, the adjustment, the host's argmax at every verify position) with an adjustment that
changes nothing, ``logit_bias={0: 0.0}``, so the tokens must still be the same.

    python scripts/bench_logprobs.py --model smollm2-135m --out docs/bench/logprobs
    python scripts/bench_logprobs.py --processors --out docs/bench/processors
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from recguide_trt.bench.paired_modes import COUNTS, add_arguments, check_counts

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap, "ar,recguide")
    ap.add_argument("--logprobs", type=int, default=5, help="alternatives per token when asked (default 5)")
    ap.add_argument("--processors", action="store_true",
                    help="time the logits processors' path (a no-op logit_bias) instead of logprobs")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    a = ap.parse_args(argv)
    check_counts(ap, a, (*COUNTS, "threads"))
    if not 0 <= a.logprobs <= 20:
        ap.error(f"--logprobs must be in [0, 20], got {a.logprobs}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import torch

    from recguide_trt import LLM, SamplingParams
    from recguide_trt.bench.outputs import write_table_and_results
    from recguide_trt.bench.paired_modes import paired_rows, policy_list, request_cases, run_interleaved
    from recguide_trt.bench.peers.machine import machine_line, record_start

    policies = policy_list(a.policies, "bench_logprobs.py")
    torch.set_num_threads(a.threads)
    rec = record_start(REPO, ["scripts/bench_logprobs.py", *(sys.argv[1:] if argv is None else argv)])
    llm = LLM(a.model, backend=a.backend, max_num_seqs=max(a.batch, 1))
    workload, cases = request_cases(llm, a.serial_prompts, a.batch)
    asked = {"logit_bias": {0: 0.0}} if a.processors else {"logprobs": a.logprobs}
    what = "logit_bias={0: 0.0}" if a.processors else f"logprobs={a.logprobs}"
    modes = {"off": {}, "on": asked}

    def run(groups, policy, mode):
        params = SamplingParams(max_tokens=a.max_tokens, policy=policy, **modes[mode])
        t0, outs = time.perf_counter(), []
        for g in groups:
            outs += llm.generate(g, [params] * len(g))
        return time.perf_counter() - t0, outs

    first: dict = {}
    problems = []

    def check(rnd, case, policy, got):
        if [o.token_ids for o in got["off"]] != [o.token_ids for o in got["on"]]:
            problems.append(f"round {rnd}, {case}, {policy}: tokens differ with {what}")
        # every policy's tokens, and logprobs when asked, equal the first policy's
        seen = [(o.token_ids, o.logprobs) for o in got["on"]]
        if seen != first.setdefault((case, rnd), seen):
            problems.append(f"round {rnd}, {case}, {policy}: tokens or logprobs differ from {policies[0]}'s")

    for policy in policies:  # warm-up: the step-cost table, the thread pool, the KV pages
        run([cases["batch 1"][0]], policy, "on")
    tok_s = run_interleaved(cases, policies, list(modes), a.rounds, run, check)

    rec["loadavg_end"] = list(os.getloadavg())
    rows = paired_rows(tok_s, cases, policies, "off", "on")
    title = "The logits processors' path" if a.processors else "Log-probabilities"
    lines = [f"# {title}: output tok/s with and without, {a.model}", "", f"Machine: {machine_line(rec)}", "",
             f"Command: `{rec['command']}`", "",
             f"{workload} prompts, greedy, {a.max_tokens} tokens each, backend {llm.backend_name}; `{what}` "
             f"against none, alternating in each of {a.rounds} rounds. Same tokens with and without, and every policy's "
             f"tokens{'' if a.processors else ' and logprobs'} equal to {policies[0]}'s: "
             f"{'yes' if not problems else 'NO (' + '; '.join(problems[:3]) + ')'}.",
             "", f"| case | policy | tok/s, none (best) | tok/s, {what} (best) | with / without (median of rounds) |",
             "|---|---|---:|---:|---:|"]
    lines += [f"| {r['case']} | {r['policy']} | {r['tok_s_off']:.1f} | {r['tok_s_on']:.1f} | {r['ratio_median']:.3f} |"
              for r in rows]
    md = "\n".join(lines) + "\n"
    print("\n" + md)
    write_table_and_results(a.out, md, {"machine": rec, "model": a.model, "backend": llm.backend_name,
                                        "asked": what, "max_tokens": a.max_tokens, "rows": rows,
                                        "problems": problems})
    llm.shutdown()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
