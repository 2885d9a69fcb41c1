#!/usr/bin/env python
"""How alike ``recguide bench --interleave step`` measures identical work: N engines over one model, every one
running the same AR cell, stepped in turns as the sweep steps its policies.

Each engine's throughput against the first engine's, per repeat, is what the step-interleaved sweep's ratios carry
besides the policies themselves (the engines' own weight copies and KV caches, the turn order, the host's drift
within a step). Repeats alternate the engines' place in the turn order (first, then last).

    python scripts/check_step_twins.py --model smollm2-135m --compute-dtype bfloat16 --kv-cache-dtype bfloat16 \\
        --concurrency 16 --engines 3 --repeats 4

prints one line per repeat and the spread of the ratios; ``--out FILE`` also writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args(argv=None) -> argparse.Namespace:
    from recguide_trt.bench.workloads import WORKLOADS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="a model name or checkpoint directory")
    p.add_argument("--compute-dtype", default=None, choices=["float32", "bfloat16"])
    p.add_argument("--kv-cache-dtype", default=None, choices=["float32", "bfloat16"])
    p.add_argument("--workload", default="chat-code", choices=WORKLOADS)
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight on each engine")
    p.add_argument("--engines", type=int, default=3, help="engines, each running the same AR cell (>= 2)")
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--requests", type=int, default=8, help="measured requests per cell: max(2·C, this)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--max-prompt-tokens", type=int, default=384)
    p.add_argument("--out", type=Path, default=None, help="write the ratios as JSON here")
    a = p.parse_args(argv)
    for name in ("concurrency", "repeats", "requests", "max_tokens", "max_prompt_tokens"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.engines < 2:
        p.error(f"--engines must be >= 2, got {a.engines}")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    from recguide_trt import LLM, SamplingParams
    from recguide_trt.bench.loop import Cell
    from recguide_trt.bench.step_interleave import StepClock, run_interleaved
    from recguide_trt.bench.workloads import load_prompts
    from recguide_trt.runtime.engine import EngineConfig

    llm = LLM(a.model, compute_dtype=a.compute_dtype, kv_cache_dtype=a.kv_cache_dtype,
              engine_config=EngineConfig(max_num_seqs=1, prefix_cache=False))
    cfg = llm.config
    limit = llm.engine.config.max_model_len - a.max_tokens
    if limit < 1:
        raise SystemExit(f"check_step_twins: --max-tokens {a.max_tokens} leaves no room for a prompt")
    prompts = load_prompts(a.workload, 164, llm.tokenizer.encode if llm.tokenizer else None, cfg.vocab_size,
                           min(a.max_prompt_tokens, limit), avoid=(cfg.mask_token_id, cfg.eos_token_id), seed=0,
                           render_chat=llm.chat_prompt if llm.has_chat_template else None)
    need = max(len(p) for p in prompts) + a.max_tokens
    clocks = [StepClock() for _ in range(a.engines)]
    engines = [llm.new_engine(c, max_num_seqs=a.concurrency, max_model_len=need) for c in clocks]

    def params(n: int) -> SamplingParams:
        return SamplingParams(max_tokens=n, policy="ar")

    rows = []
    for rep in range(a.repeats):
        order = list(range(a.engines)) if rep % 2 == 0 else list(reversed(range(a.engines)))
        forward0 = [e.phase_times["forward"] for e in engines]
        cells = [Cell(engines[i], prompts, params, a.concurrency, max(2 * a.concurrency, a.requests), a.max_tokens,
                      f"engine{i}") for i in order]
        results = run_interleaved(cells, [clocks[i] for i in order])
        tok_s = {i: r.throughput["output_tok_s"] for i, r in zip(order, results)}
        forward = [e.phase_times["forward"] - f for e, f in zip(engines, forward0)]
        ratios = [tok_s[i] / tok_s[0] for i in range(a.engines)]
        rows.append({"repeat": rep, "order": order, "tok_s": [tok_s[i] for i in range(a.engines)],
                     "forward_s": forward, "ratio_to_engine0": ratios})
        print(f"repeat {rep}: order {order}; tok/s " + ", ".join(f"{tok_s[i]:.1f}" for i in range(a.engines))
              + "; forward s " + ", ".join(f"{f:.2f}" for f in forward)
              + "; / engine 0 " + ", ".join(f"{r:.3f}" for r in ratios), flush=True)
    others = [r for row in rows for r in row["ratio_to_engine0"][1:]]
    print(f"identical AR cells, C = {a.concurrency}, {a.engines} engines, {a.repeats} repeats: each engine / engine 0 "
          f"{min(others):.3f}–{max(others):.3f}")
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "repeats": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
