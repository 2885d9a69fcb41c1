#!/usr/bin/env python
"""RecGuide's overlap at one block size, forced, beside plain LinearSpec at the same block (batch 1).

For each block L: RecGuide with ``candidate_blocks=(L,)`` and ``switch_concurrency=1`` (so every
round runs a fused verify + prospective row when it has a draft), and LinearSpec at L, on the same
prompts, one request at a time. Reports MAL, the prospective hit rate, TPF, the forwards by kind,
the time the backend spent per output token in each kind of forward (the engine's own forward
timer), and whether every output equals plain AR greedy. It shows what the overlap buys at each L
on this machine: a hit saves a draft forward, a fused forward costs more than a plain verify, and
a longer block hits less often (the row bets on one verification outcome of many).

    python scripts/eval_overlap_blocks.py --blocks 2,3,4,6,8 --prompts 16 --out docs/bench/overlap
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from recguide_trt.backends.choice import add_native_dtype_args
from recguide_trt.bench.peers.machine import cpu_model
from recguide_trt.bench.workloads import WORKLOADS, prompt_texts

MODEL_HELP = "a model name or checkpoint directory (default: smollm2-135m)"


def run_cell(llm, texts: list[str], policy: str, block: int | None, max_tokens: int) -> tuple[dict, list]:
    """One policy over the prompts, one at a time: aggregate metrics, forward seconds, outputs."""
    from recguide_trt import SamplingParams
    from recguide_trt.runtime.metrics import aggregate

    params = SamplingParams(max_tokens=max_tokens, policy=policy, block_size=block)
    forward0 = llm.engine.time_forward
    metrics, outputs = [], []
    for text in texts:
        out = llm.generate([text], params)[0]
        metrics.append(out.metrics)
        outputs.append(out.token_ids)
    agg = aggregate(metrics)
    agg["forward_s"] = llm.engine.time_forward - forward0
    return agg, outputs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help=MODEL_HELP)
    add_native_dtype_args(ap)
    ap.add_argument("--blocks", default="2,3,4,6,8", help="comma-separated block sizes (default 2,3,4,6,8)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--workload", choices=WORKLOADS, default="chat-code")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("results/overlap"))
    a = ap.parse_args(argv)
    try:
        blocks = [int(b) for b in a.blocks.split(",")]
    except ValueError:
        raise SystemExit(f"--blocks: comma-separated integers, got {a.blocks!r}") from None
    if any(b < 2 for b in blocks):
        raise SystemExit(f"--blocks: every block must be >= 2, got {a.blocks!r}")
    if a.prompts < 1:
        raise SystemExit("--prompts must be >= 1")
    import torch  # after the arguments: --help and bad values answer without it
    from tqdm import tqdm

    from recguide_trt import LLM, EngineConfig, SamplingParams
    from recguide_trt.runtime.policies.recguide import RecGuideConfig

    torch.set_num_threads(a.threads)
    load = os.getloadavg()
    rows, ar_tokens = [], None
    texts = None
    for L in tqdm(blocks, desc="blocks", file=sys.stderr):
        ec = EngineConfig(max_num_seqs=1, max_model_len=2048, max_block_size=max(max(blocks), 2),
                          recguide=RecGuideConfig(candidate_blocks=(L,), switch_concurrency=1))
        llm = LLM(a.model, compute_dtype=a.compute_dtype, kv_cache_dtype=a.kv_cache_dtype, engine_config=ec)
        if texts is None:
            texts = prompt_texts(a.workload, a.prompts, render_chat=llm._render_chat if llm.has_chat_template else None)
        llm.generate(texts[:1], SamplingParams(max_tokens=8, policy="recguide"))  # warm-up + cost table
        if ar_tokens is None:
            ar, ar_tokens = run_cell(llm, texts, "ar", None, a.max_tokens)
            rows.append({"policy": "ar", "block": 1, **ar, "same_as_ar": len(texts)})
        for policy in ("linearspec", "recguide"):
            agg, outs = run_cell(llm, texts, policy, L, a.max_tokens)
            same = sum(o == r for o, r in zip(outs, ar_tokens))
            rows.append({"policy": "overlap" if policy == "recguide" else "linearspec", "block": L, **agg,
                         "same_as_ar": same})
        llm.shutdown()
    ar_ms = 1e3 * rows[0]["forward_s"] / rows[0]["output_tokens"]
    lines = [f"# Overlap by block size, batch 1 ({a.workload}, {a.prompts} prompts, {a.max_tokens} tokens)", "",
             f"Model {a.model}, native backend, compute {a.compute_dtype or 'float32'}, KV "
             f"{a.kv_cache_dtype or 'float32'}; {cpu_model()}, {a.threads} threads; load before "
             f"{load[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
             "overlap = RecGuide forced to one block with every round fused (verify + prospective row); "
             "forward ms / token = the engine's forward timer (prefill included) / output tokens; "
             "x AR = AR's forward ms per token / the row's.", "",
             "| policy | L | MAL | hit rate | TPF | draft / verify / fused forwards | forward ms / token | x AR | "
             "= AR |", "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        f = r["forwards"]
        ms = 1e3 * r["forward_s"] / r["output_tokens"]
        hit = f"{r['hit_rate']:.2f}" if r["hit_rate"] is not None else "–"
        lines.append(f"| {r['policy']} | {r['block']} | {r['mal']:.2f} | {hit} | {r['tpf']:.2f} | "
                     f"{f.get('draft', 0)} / {f.get('verify', 0)} / {f.get('fused', 0)} | {ms:.2f} | "
                     f"{ar_ms / ms:.3f} | {r['same_as_ar']}/{len(texts)} |")
    table = "\n".join(lines) + "\n"
    print(table)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "table.md").write_text(table)
    (a.out / "results.json").write_text(json.dumps({"rows": rows, "load": load, "cpu": cpu_model(),
                                                    "args": {k: str(v) for k, v in vars(a).items()}}, indent=1))
    print(f"wrote {a.out / 'table.md'}", file=sys.stderr)
    bad = [r for r in rows if r["same_as_ar"] != len(texts)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
