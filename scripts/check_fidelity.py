#!/usr/bin/env python
"""Check that our AR greedy output equals transformers' LlamaForCausalLM on the same weights, token for token.

Half chat prompts (chat template), half code prefixes (standard library); ours decodes them in one
batch, transformers one at a time; each first divergence is measured (top-2 logit margin in float32
and float64) and called a near-tie or a real mismatch. Exits 1 on a real mismatch.

    python scripts/check_fidelity.py                                  # smollm2-135m, 32 prompts x 128
    python scripts/check_fidelity.py --prompts 32 --max-tokens 128 --out docs/fidelity
    python scripts/check_fidelity.py --model DIR --backend torch --prompts 4 --max-tokens 16
    python scripts/check_fidelity.py --device cuda --out fidelity-cuda        # on a GPU (scripts/gpu_check.sh)
    python scripts/check_fidelity.py --compute-dtype bfloat16 --kv-cache-dtype bfloat16 --out docs/fidelity/bf16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from recguide_trt.backends.choice import BACKENDS, add_native_dtype_args
from recguide_trt.bench.fidelity import REL_TOL, check_fidelity, write_report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="a model name or an NLD checkpoint directory")
    ap.add_argument("--prompts", type=int, default=32, help="number of prompts (half chat, half code)")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens to generate at most per prompt")
    ap.add_argument("--backend", choices=BACKENDS, default=None, help="our backend (default: the default one)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where both engines run (cuda: ours on torch CUDA, transformers on the GPU)")
    add_native_dtype_args(ap)
    ap.add_argument("--out", type=Path, default=None, help="write fidelity.json and fidelity.md here")
    ap.add_argument("--hf-dir", type=Path, default=None,
                    help="the converted Llama directory: reused when it exists, else written there "
                         "(default: a temporary directory)")
    ap.add_argument("--rel-tol", type=float, default=REL_TOL,
                    help="near-tie threshold: |fp64 margin| <= REL_TOL x max(1, |top logit|)")
    ap.add_argument("--close-calls", type=int, default=5,
                    help="also report this many agreed tokens with the smallest top-2 margins, re-measured in "
                         "float64 (slow: one float64 forward each)")
    a = ap.parse_args(argv)
    if a.prompts < 1 or a.max_tokens < 1 or a.close_calls < 0:
        ap.error("--prompts and --max-tokens must be positive, --close-calls >= 0")
    report = check_fidelity(a.model, a.prompts, a.max_tokens, backend=a.backend, hf_dir=a.hf_dir,
                            rel_tol=a.rel_tol, close_calls=a.close_calls, log=lambda s: print(s, file=sys.stderr),
                            compute_dtype=a.compute_dtype, kv_cache_dtype=a.kv_cache_dtype, device=a.device)
    for r in report.results:
        d = r.divergence
        if d is not None:
            print(f"prompt {r.index} ({r.kind}): {d.verdict} at token {d.pos}: transformers {d.theirs} "
                  f"{d.theirs_text!r}, ours {d.ours} {d.ours_text!r}; margin fp32 {d.margin_fp32}, "
                  f"fp64 {d.margin_fp64}", file=sys.stderr)
    if a.out is not None:
        for f in write_report(report, a.out):
            print(f"wrote {f}", file=sys.stderr)
    print(report.closest(), file=sys.stderr)
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
