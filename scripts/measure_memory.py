"""Peak memory (RSS) at C=64 and KV-cache bytes per cached token, per backend.

    python scripts/measure_memory.py [--model NAME|DIR] [--backends native,native:bfloat16,torch,onnxruntime]
                                     [--max-model-len 1024] [--out docs/bench/memory.md]

A backend ``native:bfloat16`` is the native backend with ``kv_cache_dtype="bfloat16"``.

Each backend runs in a fresh process: LLM(model, max_num_seqs=64) generates 64 prompts of the `mixed`
workload x 128 tokens (EOS ignored) at once; the process reports its peak RSS (getrusage) and the
KV cache it allocated (bytes / (slots x capacity) = bytes per cached token, all layers, K and V).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, torch
torch.set_num_threads(2)
from recguide_trt import LLM, SamplingParams
from recguide_trt.bench.workloads import load_prompts
backend, model, kvd, mml = sys.argv[1], sys.argv[2] or None, sys.argv[3] or None, int(sys.argv[4])
llm = LLM(model, backend=backend, max_num_seqs=64, max_model_len=mml, kv_cache_dtype=kvd,
          **({"num_threads": 2} if backend == "onnxruntime" else {}))
prompts = load_prompts("mixed", 64, encode=llm.encode, max_prompt_tokens=min(512, mml - 128))
rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
outs = llm.generate(prompts, SamplingParams(max_tokens=128, policy="ar", stop_at_eos=False))
be = llm.backend
kv = sum(int(getattr(t, "nbytes", 0) or t.numel() * t.element_size()) for t in list(be.k_cache) + list(be.v_cache))
name = (be.name if hasattr(be, "name") else backend) + (f" (KV {kvd})" if kvd else "")
print(json.dumps({"backend": name, "rss_peak_mib": resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss / 1024, "rss_after_load_mib": rss_loaded / 1024, "kv_bytes": kv,
    "slots": be.max_slots, "capacity": be.slot_capacity, "kv_bytes_per_token": kv / (be.max_slots * be.slot_capacity),
    "tokens": sum(len(o.token_ids) for o in outs)}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="a model name or checkpoint directory (default: the default model)")
    ap.add_argument("--backends", default="native,torch,onnxruntime")
    ap.add_argument("--max-model-len", type=int, default=1024, help="context per slot (default 1024)")
    ap.add_argument("--out", default="docs/bench/memory.md")
    a = ap.parse_args(argv)
    if a.max_model_len < 192:
        ap.error("--max-model-len: at least 192 (prompts plus the 128 generated tokens)")
    rows, failed = [], []
    for spec in a.backends.split(","):
        b, _, kv = spec.partition(":")
        proc = subprocess.run([sys.executable, "-c", CHILD, b, a.model, kv, str(a.max_model_len)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{spec}: failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}",
                  file=sys.stderr)
            failed.append(spec)
            continue
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    lines = [f"`python scripts/measure_memory.py {' '.join(argv or sys.argv[1:])}`, {time.strftime('%Y-%m-%d')}, "
             f"{os.cpu_count()} cores; 64 prompts x 128 tokens at once, max_num_seqs=64 (capacity = max_model_len "
             f"{a.max_model_len} + 2 x max block per slot).", "",
             "| backend | peak RSS (MiB) | RSS after load (MiB) | KV cache (MiB) | KV bytes per cached token |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['backend']} | {r['rss_peak_mib']:.0f} | {r['rss_after_load_mib']:.0f} | "
                     f"{r['kv_bytes'] / 2**20:.0f} | {r['kv_bytes_per_token']:.0f} |")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"-> {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
