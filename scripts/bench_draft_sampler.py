#!/usr/bin/env python3
"""What the draft sampler buys: output tok/s and tokens per round with and without it, interleaved.

Two engines on the same model, one choosing greedy draft tokens with the adapter's draft sampler and one with each
position's own top token (``EngineConfig(draft_sampler=False)``), answer the same prompts (the held-out chat + code
workload) one at a time and all at once, for each policy; the two alternate which goes first in every round.
Greedy: both must give AR's tokens, and the script exits 1 if any output differs. AR drafts nothing, so its row
runs the same work twice and shows how far this host drifts between back-to-back runs.

    python scripts/bench_draft_sampler.py --out docs/bench/draft-sampler
    python scripts/bench_draft_sampler.py --policies ar,linearspec@4,recguide --serial-prompts 8 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_POLICIES = "ar,linearspec@4,linearspec@8,recguide"


def split_policy(name: str) -> tuple[str, int | None]:
    """``linearspec@8`` → ("linearspec", 8); a bare name keeps the engine's block size."""
    policy, _, block = name.partition("@")
    return policy, int(block) if block else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from recguide_trt.bench.paired_modes import COUNTS, add_arguments, check_counts
    from recguide_trt.runtime.params import POLICIES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap, DEFAULT_POLICIES)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    a = ap.parse_args(argv)
    check_counts(ap, a, (*COUNTS, "threads"))
    a.policy_names = [p.strip() for p in a.policies.split(",") if p.strip()]
    for name in a.policy_names:
        policy, _, block = name.partition("@")
        if policy not in POLICIES or (block and (not block.isdigit() or int(block) < 2)):
            ap.error(f"--policies: {name!r} is not a policy (choose from {', '.join(POLICIES)}; "
                     f"linearspec@N picks its block size, N >= 2)")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import torch

    from recguide_trt import LLM, EngineConfig, SamplingParams
    from recguide_trt.bench.outputs import write_table_and_results
    from recguide_trt.bench.paired_modes import paired_rows, request_cases, run_interleaved
    from recguide_trt.bench.peers.machine import machine_line, record_start

    torch.set_num_threads(a.threads)
    rec = record_start(REPO, ["scripts/bench_draft_sampler.py", *(sys.argv[1:] if argv is None else argv)])
    slots = max(a.batch, 1)
    llms = {mode: LLM(a.model, backend=a.backend, engine_config=EngineConfig(max_num_seqs=slots, draft_sampler=on))
            for mode, on in (("off", False), ("on", True))}
    if llms["on"].engine.executor.sampler is None:
        raise SystemExit(f"bench_draft_sampler.py: {a.model} has no draft sampler "
                         f"(recguide train-drafter writes one beside its adapter)")
    workload, cases = request_cases(llms["on"], a.serial_prompts, a.batch)
    rounds_per_token: dict = {}

    def run(groups, name, mode):
        policy, block = split_policy(name)
        params = SamplingParams(max_tokens=a.max_tokens, policy=policy, block_size=block)
        t0, outs = time.perf_counter(), []
        for g in groups:
            outs += llms[mode].generate(g, [params] * len(g))
        return time.perf_counter() - t0, outs

    first: dict = {}
    problems = []

    def check(rnd, case, name, got):
        for mode, outs in got.items():
            tokens = [o.token_ids for o in outs]
            if tokens != first.setdefault((case, rnd), tokens):
                problems.append(f"round {rnd}, {case}, {name}, sampler {mode}: tokens differ from "
                                f"{a.policy_names[0]}'s")
            r = rounds_per_token.setdefault((case, name, mode), [0, 0])
            r[0] += sum(o.metrics.decode_tokens for o in outs)
            r[1] += sum(o.metrics.rounds for o in outs)

    for name in a.policy_names:  # warm-up: the step-cost tables, the thread pool, the KV pages
        for mode in llms:
            run([cases["batch 1"][0]], name, mode)
    tok_s = run_interleaved(cases, a.policy_names, ["off", "on"], a.rounds, run, check)

    rec["loadavg_end"] = list(os.getloadavg())
    rows = paired_rows(tok_s, cases, a.policy_names, "off", "on")
    for r in rows:
        for mode in ("off", "on"):
            tokens, rounds = rounds_per_token[(r["case"], r["policy"], mode)]
            r[f"tokens_per_round_{mode}"] = tokens / rounds if rounds else None
    lines = [f"# The draft sampler: output tok/s and tokens per round with and without it, {a.model}", "",
             f"Machine: {machine_line(rec)}", "", f"Command: `{rec['command']}`", "",
             f"{workload} prompts, greedy, {a.max_tokens} tokens each, backend {llms['on'].backend_name}; the sampler "
             f"on against off, alternating in each of {a.rounds} rounds. Every output equal to "
             f"{a.policy_names[0]}'s: {'yes' if not problems else 'NO (' + '; '.join(problems[:3]) + ')'}.", "",
             "| case | policy | tok/s, off (best) | tok/s, on (best) | on / off (median of rounds) "
             "| tokens per round, off | on |", "|---|---|---:|---:|---:|---:|---:|"]

    def tpr(v):
        return "–" if v is None else f"{v:.2f}"
    lines += [f"| {r['case']} | {r['policy']} | {r['tok_s_off']:.1f} | {r['tok_s_on']:.1f} | {r['ratio_median']:.3f} "
              f"| {tpr(r['tokens_per_round_off'])} | {tpr(r['tokens_per_round_on'])} |" for r in rows]
    md = "\n".join(lines) + "\n"
    print("\n" + md)
    write_table_and_results(a.out, md, {"machine": rec, "model": a.model, "backend": llms["on"].backend_name,
                                        "max_tokens": a.max_tokens, "rows": rows, "problems": problems})
    for llm in llms.values():
        llm.shutdown()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
