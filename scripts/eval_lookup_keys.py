#!/usr/bin/env python
"""What a prompt-lookup draft accepts, by what found it: the n-gram, and how far back the match agrees.

For every prompt the greedy AR continuation is computed once (the engine, batched); then at every output position
the context so far is looked up (``runtime.prompt_lookup.find_lookup``, up to ``--k`` tokens) and the draft is
compared with the continuation: the tokens a verify would accept. Two occurrence choices are compared on the same
positions: the latest occurrence of the matched n-gram (what the lookup chose before agreement was followed), and
the one agreeing furthest back (``MAX_AGREE``, the runtime's choice). Rows by n-gram and by agreement bin
(``runtime.lookup_acceptance.AGREE_EDGES``) show what RecGuide's lookup estimate keys on.

Choices are made on the training prompts (``--workload chat-code-train``, the default); the held-out set is what the
benchmark judges and is reported for validation only.

    python scripts/eval_lookup_keys.py --out docs/eval/lookup-keys-train
    python scripts/eval_lookup_keys.py --workload chat-code --prompts 64 --out docs/eval/lookup-keys-heldout
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="a named model or a checkpoint directory")
    p.add_argument("--workload", default="chat-code-train", help="prompt set (bench workloads' names)")
    p.add_argument("--prompts", type=int, default=96, help="prompts of the workload")
    p.add_argument("--max-tokens", type=int, default=128, help="greedy tokens generated per prompt")
    p.add_argument("--k", type=int, default=7, help="lookup tokens per draft (7: the lookup policy's default block of 8 less its seed)")
    p.add_argument("--compute-dtype", default="bfloat16", help="the native backend's compute dtype")
    p.add_argument("--kv-cache-dtype", default="bfloat16", help="the native backend's KV-cache dtype")
    p.add_argument("--out", type=Path, required=True, help="folder for table.md and results.json")
    a = p.parse_args(argv)
    for name in ("prompts", "max_tokens", "k"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    return a


def tally(sequences: list[tuple[list[int], list[int]]], k: int) -> dict:
    """Mean accepted tokens per lookup position, for each occurrence choice, by n-gram and by agreement bin."""
    import numpy as np

    from recguide_trt.runtime.lookup_acceptance import AGREE_EDGES, agreement_bin
    from recguide_trt.runtime.prefix_cache import common_prefix
    from recguide_trt.runtime.prompt_lookup import MAX_AGREE, MAX_NGRAM, find_lookup

    stats = {choice: defaultdict(lambda: [0, 0]) for choice in ("latest", "furthest")}
    seconds = dict.fromkeys(stats, 0.0)
    calls = 0
    for prompt, output in sequences:
        seq = np.asarray(prompt + output, dtype=np.int64)
        for t in range(len(prompt), len(seq)):
            calls += 1
            for choice, max_agree in (("latest", MAX_NGRAM), ("furthest", MAX_AGREE)):
                t0 = time.perf_counter()
                found = find_lookup(seq[:t], k, max_agree=max_agree)
                seconds[choice] += time.perf_counter() - t0
                if not found.tokens:
                    continue
                acc = common_prefix(found.tokens, output[t - len(prompt):])  # the tokens a verify accepts
                keys = ["all", f"ngram {found.ngram}"]
                if choice == "furthest":
                    keys.append(f"agree bin {agreement_bin(found.agree)}")
                for key in keys:
                    s = stats[choice][key]
                    s[0] += 1
                    s[1] += acc
    edges = (0, *AGREE_EDGES)
    names = {f"agree bin {i}": f"agree {lo + 1}-{hi}" if hi > lo + 1 else f"agree {hi}"
             for i, (lo, hi) in enumerate(zip(edges, edges[1:]))}
    names[f"agree bin {len(AGREE_EDGES)}"] = f"agree {AGREE_EDGES[-1] + 1}+"
    result = {choice: {names.get(key, key): {"positions": n, "mean_accepted": acc / n}
                       for key, (n, acc) in sorted(rows.items())} for choice, rows in stats.items()}
    lookup_us = {choice: 1e6 * s / max(calls, 1) for choice, s in seconds.items()}
    return {"result": result, "lookup_us": lookup_us}


def main(argv=None) -> int:
    a = parse_args(argv)
    from recguide_trt import (  # after the arguments: --help and bad values answer without torch
        LLM,
        SamplingParams,
    )
    from recguide_trt.bench.peers.machine import cpu_model
    from recguide_trt.bench.workloads import load_prompts

    load = os.getloadavg()
    llm = LLM(a.model, compute_dtype=a.compute_dtype, kv_cache_dtype=a.kv_cache_dtype)
    render = llm.chat_prompt if llm.has_chat_template else None
    try:
        prompts = load_prompts(a.workload, a.prompts, encode=llm.encode, render_chat=render)
    except ValueError as e:
        raise SystemExit(f"--workload: {e}") from None
    t0 = time.time()
    outs = llm.generate(prompts, SamplingParams(max_tokens=a.max_tokens, temperature=0.0, policy="ar"))
    gen_s = time.time() - t0
    llm.shutdown()
    tallied = tally([(p, list(o.token_ids)) for p, o in zip(prompts, outs)], a.k)
    result, lookup_us = tallied["result"], tallied["lookup_us"]
    lines = [f"# Prompt-lookup acceptance by key ({a.workload}, {len(prompts)} prompts, {a.max_tokens} greedy tokens, "
             f"up to {a.k} lookup tokens)", "",
             f"Model {a.model}; {cpu_model()}; load before {load[0]:.2f}; generation {gen_s:.0f} s; "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Every output position whose context holds a "
             f"match is one lookup; accepted = its leading tokens equal to the greedy continuation.", "",
             "| occurrence chosen | key | positions | mean accepted |", "|---|---|---:|---:|"]
    for choice, rows in result.items():
        for key, r in rows.items():
            lines.append(f"| {choice} | {key} | {r['positions']} | {r['mean_accepted']:.3f} |")
    lines += ["", "Mean time of one lookup (every position, found or not; one process, this host): "
              + ", ".join(f"{choice} {us:.1f} us" for choice, us in lookup_us.items()) + "."]
    table = "\n".join(lines) + "\n"
    print(table)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "table.md").write_text(table)
    (a.out / "results.json").write_text(json.dumps({"result": result, "lookup_us": lookup_us, "load": load, "cpu": cpu_model(),
                                                    "args": {k: str(v) for k, v in vars(a).items()}}, indent=1))
    print(f"wrote {a.out / 'table.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
