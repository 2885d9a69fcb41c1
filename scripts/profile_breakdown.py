"""Step-time breakdown: AR, LinearSpec-L8 and fused (RecGuide overlap) decode steps at C=1 and C=64.

    python scripts/profile_breakdown.py [--backends native,torch,onnxruntime] [--concurrency 1,64]
                                        [--max-tokens 48] [--out docs/bench/breakdown.md]

Per backend x scenario x C: C prompts of the `mixed` workload are prefilled (untimed), then the
decode steps run with the engine's phase timers and the backend's own split on
(recguide_trt.bench.breakdown). Writes a Markdown table (ms per decode step by category, and the
same as shares) with the machine it ran on, and a JSON file beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from recguide_trt.models.names import MODEL_HELP

SCENARIOS = {"ar": ("ar", None), "linearspec-L8": ("linearspec", 8), "fused": ("recguide", None)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help=MODEL_HELP)
    ap.add_argument("--backends", default="native,torch,onnxruntime")
    ap.add_argument("--concurrency", default="1,64")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"of {', '.join(SCENARIOS)}")
    ap.add_argument("--max-tokens", type=int, default=48, help="decode tokens per request (default 48)")
    ap.add_argument("--prompt-tokens", type=int, default=256, help="longest prompt kept, in tokens (default 256)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="docs/bench/breakdown.md")
    a = ap.parse_args(argv)
    try:
        concurrency = [int(c) for c in a.concurrency.split(",")]
    except ValueError:
        ap.error(f"--concurrency takes integers separated by commas, got {a.concurrency!r}")
    if any(c < 1 for c in concurrency):
        ap.error("--concurrency values must be >= 1")
    scenarios = a.scenarios.split(",")
    if unknown := [s for s in scenarios if s not in SCENARIOS]:
        ap.error(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)}")
    if a.max_tokens < 2:
        ap.error("--max-tokens must be >= 2")

    import torch

    torch.set_num_threads(a.threads)
    from recguide_trt import LLM, EngineConfig
    from recguide_trt.backends.choice import BACKENDS
    from recguide_trt.bench.breakdown import measure, shares, table
    from recguide_trt.bench.peers.machine import cpu_model
    from recguide_trt.bench.workloads import load_prompts
    from recguide_trt.runtime.cost_model import CostTable
    from recguide_trt.runtime.policies.recguide import RecGuideConfig

    backends = a.backends.split(",")
    if unknown := [b for b in backends if b not in BACKENDS]:
        ap.error(f"unknown backend(s) {unknown}; choose from {', '.join(BACKENDS)}")
    # Fused steps on demand: overlap at every load (switch point above any C) and a flat cost
    # table that makes overlap pay, so every RecGuide step is a fused verify + prospective row.
    flat = CostTable([1, 64], [1, 64], [[1.0, 1.0], [1.0, 1.0]], {"synthetic": "profile_breakdown"})
    rows = []
    with tempfile.TemporaryDirectory(prefix="recguide-breakdown-") as work:
        for backend in backends:
            ec = EngineConfig(max_num_seqs=max(concurrency), max_model_len=a.prompt_tokens + a.max_tokens + 64,
                              cost_table=flat, cost_refit=False, prefix_cache=False,
                              recguide=RecGuideConfig(switch_concurrency=10**6, overlap="fused"))
            try:
                llm = LLM(a.model, backend=backend, engine_config=ec, **({"num_threads": a.threads}
                                                                if backend == "onnxruntime" else {}))
            except Exception as exc:
                print(f"{backend}: not available ({exc})", file=sys.stderr)
                continue
            prompts = load_prompts("mixed", max(concurrency), encode=llm.encode,
                                   max_prompt_tokens=a.prompt_tokens)
            for name in scenarios:
                policy, block = SCENARIOS[name]
                for c in concurrency:
                    measure(llm, policy, c, prompts, 8, Path(work), block)  # warm-up
                    r = measure(llm, policy, c, prompts, a.max_tokens, Path(work), block)
                    r.policy = name
                    rows.append(r)
                    print(f"{backend:12s} {name:14s} C={c:3d}: {sum(r.ms_per_step.values()):7.3f} ms/step "
                          f"{r.tok_s:8.0f} tok/s", flush=True)
            llm.shutdown()
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": a.threads, "torch": torch.__version__,
               "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M"),
               "loadavg_end": os.getloadavg(), "command": "python scripts/profile_breakdown.py " + " ".join(argv or sys.argv[1:])}
    md = (f"# Decode step breakdown\n\n`{machine['command']}` on {machine['cpu']} ({machine['cores']} cores, "
          f"{a.threads} threads), torch {machine['torch']}, {machine['date']}; load average at the end "
          f"{', '.join(f'{x:.2f}' for x in machine['loadavg_end'])}. Prompts: the `mixed` workload (at most "
          f"{a.prompt_tokens} tokens), {a.max_tokens} decode tokens per request, EOS ignored; prefill excluded. "
          f"`fused` = RecGuide forced to overlap (every step a verify + prospective row).\n\n"
          f"Milliseconds per decode step:\n\n{table(rows)}\n\nShares of the step:\n\n{shares(rows)}\n")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    out.with_suffix(".json").write_text(json.dumps({"machine": machine, "rows": [asdict(r) for r in rows]}, indent=1))
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
