#!/usr/bin/env python3
"""Where a batched generate's time goes: prefill against decode, and the native forward's phases.

The peer bench times ``generate(64 prompts, 96 tokens)`` end to end, prefill included. This splits it:
each round runs the same prompts once with ``max_tokens=1`` (prefill and one token) and once with
``--tokens``, interleaved; decode = the difference. With the native backend its per-phase timers
(projections, attention, MLP, head) are read for one more pair of calls, so a phase's prefill and
decode seconds are told apart too.

    python scripts/bench_prefill_decode.py --model smollm2-135m --prompts 64 --tokens 96
    python scripts/bench_prefill_decode.py --model smollm2-135m --compute-dtype bfloat16 --kv-cache-dtype bfloat16

Prompts: the peer bench's (``scripts/bench_peers.py``: the workload's prompts cut to their last
``--prompt-tokens`` tokens), greedy AR, EOS ignored.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from recguide_trt.backends.choice import add_native_dtype_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a model name or checkpoint directory (default smollm2-135m)")
    ap.add_argument("--backend", default="native", help="LLM backend (default native; phases need native)")
    ap.add_argument("--prompts", type=int, default=64, help="prompts submitted at once (default 64)")
    ap.add_argument("--tokens", type=int, default=96, help="new tokens per prompt (default 96)")
    ap.add_argument("--prompt-tokens", type=int, default=512, help="each prompt cut to its last N tokens (default 512)")
    ap.add_argument("--snippet-chars", type=int, default=2400, help="longest code snippet, characters (default 2400)")
    ap.add_argument("--workload", default="chat-code", help="prompt workload (default chat-code)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best of each is kept (default 2)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    add_native_dtype_args(ap)
    ap.add_argument("--out", type=Path, help="also write the result as JSON here")
    a = ap.parse_args(argv)
    for name in ("prompts", "tokens", "prompt_tokens", "snippet_chars", "rounds", "threads"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.tokens < 2:
        ap.error("--tokens must be >= 2 (decode = a --tokens call minus a 1-token call)")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import torch
    from bench_peers import make_prompts

    from recguide_trt import LLM, SamplingParams
    from recguide_trt.bench.outputs import write_table_and_results
    from recguide_trt.bench.peers.machine import machine_line, record_start
    from recguide_trt.models import resolve_model

    torch.set_num_threads(a.threads)
    rec = record_start(REPO, ["scripts/bench_prefill_decode.py", *(sys.argv[1:] if argv is None else argv)])
    try:
        model_dir = resolve_model(a.model)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise SystemExit(f"bench_prefill_decode.py: --model: {exc}") from None
    kw = {k: v for k, v in (("compute_dtype", a.compute_dtype), ("kv_cache_dtype", a.kv_cache_dtype)) if v}
    llm = LLM(str(model_dir), backend=a.backend, max_num_seqs=a.prompts, prefix_cache=False, **kw)  # times prefills
    prompts = make_prompts(a.workload, a.prompts, a.prompt_tokens, model_dir, a.snippet_chars)
    n_prompt = sum(map(len, prompts))

    def run(max_tokens: int) -> float:
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, policy="ar", stop_at_eos=False)
        t0 = time.perf_counter()
        llm.generate(prompts, sp)
        return time.perf_counter() - t0

    run(2)  # warm-up: the cost table, the pool, the pages of the KV cache
    pre, full = [], []
    for r in range(a.rounds):
        pre.append(run(1))
        full.append(run(a.tokens))
        print(f"round {r}: prefill + 1 token {pre[-1]:.2f} s, prefill + {a.tokens} tokens {full[-1]:.2f} s", flush=True)
    p, f = min(pre), min(full)
    decode_tokens = a.prompts * (a.tokens - 1)
    res = {"model": a.model, "backend": a.backend, **kw, "prompts": a.prompts, "prompt_tokens": n_prompt,
           "new_tokens": a.tokens, "prefill_s": round(p, 3), "total_s": round(f, 3), "decode_s": round(f - p, 3),
           "prefill_tok_s": round(n_prompt / p, 1), "decode_tok_s": round(decode_tokens / max(f - p, 1e-9), 1),
           "total_tok_s": round(a.prompts * a.tokens / f, 1), "prefill_share": round(p / f, 3)}
    be = llm.backend
    if hasattr(be, "set_timing"):  # the native forward's phase timers: one prefill call, one full call
        be.set_timing(True)
        run(1)
        tp = be.timings()
        be.set_timing(True)
        run(a.tokens)
        tf = be.timings()
        be.set_timing(False)
        res["phases"] = {k: {"prefill_s": round(tp[k], 3), "decode_s": round(tf[k] - tp[k], 3)} for k in tf}
    rec["loadavg_end"] = list(os.getloadavg())
    lines = [f"# Prefill and decode of one batched generate: {a.model}", "",
             f"Machine: {machine_line(rec)}",
             "", f"Command: `{rec['command']}`", "",
             f"{a.prompts} prompts ({n_prompt} prompt tokens), {a.tokens} new tokens each, greedy AR; best of "
             f"{a.rounds} interleaved round(s); decode = (prefill + {a.tokens} tokens) - (prefill + 1 token).", "",
             "| prefill s | decode s | total s | prefill share | prefill tok/s | decode tok/s | total tok/s |",
             "|---:|---:|---:|---:|---:|---:|---:|",
             f"| {p:.2f} | {f - p:.2f} | {f:.2f} | {p / f:.0%} | {n_prompt / p:.0f} | {res['decode_tok_s']:.0f} | "
             f"{res['total_tok_s']:.0f} |"]
    if "phases" in res:
        lines += ["", "Native forward phases (seconds, one more pair of calls):", "",
                  "| phase | prefill s | decode s |", "|---|---:|---:|"]
        lines += [f"| {k} | {v['prefill_s']:.2f} | {v['decode_s']:.2f} |" for k, v in res["phases"].items()]
    md = "\n".join(lines) + "\n"
    print("\n" + md)
    write_table_and_results(a.out, md, {"machine": rec, **res})
    return 0


if __name__ == "__main__":
    sys.exit(main())
