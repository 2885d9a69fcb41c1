#!/usr/bin/env python3
"""Time to first token with and without the engine's prefix cache, on the same model, interleaved.

Two cases a chat server sees all the time:

* **shared system prompt**: every request carries the same long system message (here a code listing the
  user asks about) and its own question;
* **multi-turn chat**: each turn's prompt is the whole conversation so far, the previous answers included.

Two engines in one process, one with ``prefix_cache=True`` (the default) and one without, answer the same
requests one at a time (C = 1), alternating which goes first. Greedy, so both must give the same tokens:
the script checks that every answer is identical and exits 1 if one is not.

    python scripts/bench_prefix_cache.py --model smollm2-135m --out docs/bench/prefix_cache
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a model name or checkpoint directory (default smollm2-135m)")
    ap.add_argument("--backend", default="native", help="LLM backend (default native)")
    ap.add_argument("--questions", type=int, default=8, help="requests in the shared-system-prompt case (default 8)")
    ap.add_argument("--turns", type=int, default=6, help="turns of the multi-turn chat (default 6)")
    ap.add_argument("--system-chars", type=int, default=1800,
                    help="characters of code in the system message (default 1800: about 500 tokens)")
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens per answer (default 48)")
    ap.add_argument("--policy", default="ar", help="decoding policy of every request (default ar)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--out", type=Path, help="write table.md and results.json here")
    a = ap.parse_args(argv)
    for name in ("questions", "turns", "system_chars", "max_tokens", "threads"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    return a


def _one(llm, messages, params):
    """One chat request alone on the engine: (answer text, token ids, TTFT s, cached prompt tokens, prompt tokens)."""
    out = llm.chat([messages], params)[0]
    m = out.metrics
    return out.text, out.token_ids, m.first_token_time - m.arrival, m.cached_prompt_tokens, m.prompt_tokens


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import torch

    from recguide_trt import LLM, SamplingParams
    from recguide_trt.bench.outputs import write_table_and_results
    from recguide_trt.bench.peers.machine import machine_line, record_start
    from recguide_trt.bench.workloads import chat_instructions, stdlib_snippets

    torch.set_num_threads(a.threads)
    rec = record_start(REPO, ["scripts/bench_prefix_cache.py", *(sys.argv[1:] if argv is None else argv)])
    engines = {on: LLM(a.model, backend=a.backend, max_num_seqs=4, prefix_cache=on) for on in (True, False)}
    if not engines[True].has_chat_template:
        raise SystemExit(f"bench_prefix_cache.py: --model {a.model} has no chat template (both cases are chats)")
    params = SamplingParams(max_tokens=a.max_tokens, temperature=0.0, policy=a.policy)
    code = stdlib_snippets(1, max_chars=a.system_chars)[0]
    system = {"role": "system", "content": "You are a careful Python reviewer. Answer questions about this module:\n"
                                           f"```python\n{code}\n```"}
    questions = chat_instructions(a.questions + a.turns)
    for llm in engines.values():   # warm-up: the step-cost table, the thread pool, the KV pages
        _one(llm, [{"role": "user", "content": "Hello!"}], SamplingParams(max_tokens=4, policy=a.policy))

    rows: dict[str, dict[bool, list]] = {"shared system prompt": {True: [], False: []},
                                         "multi-turn chat": {True: [], False: []}}
    mismatches = []
    for i, q in enumerate(questions[:a.questions]):
        order = (True, False) if i % 2 == 0 else (False, True)
        got = {on: _one(engines[on], [system, {"role": "user", "content": q}], params) for on in order}
        for on in order:
            rows["shared system prompt"][on].append(got[on])
        if got[True][1] != got[False][1]:
            mismatches.append(("shared system prompt", i))
        print(f"system prompt, request {i}: TTFT {got[True][2] * 1e3:.0f} ms cached / {got[False][2] * 1e3:.0f} ms "
              f"full ({got[True][3]} of {got[True][4]} prompt tokens from the cache)", flush=True)
    history = {on: [] for on in (True, False)}
    for t, q in enumerate(questions[a.questions:]):
        order = (True, False) if t % 2 == 0 else (False, True)
        got = {}
        for on in order:
            history[on].append({"role": "user", "content": q})
            got[on] = _one(engines[on], history[on], params)
            history[on].append({"role": "assistant", "content": got[on][0]})
            rows["multi-turn chat"][on].append(got[on])
        if got[True][1] != got[False][1]:
            mismatches.append(("multi-turn chat", t))
        print(f"chat turn {t}: TTFT {got[True][2] * 1e3:.0f} ms cached / {got[False][2] * 1e3:.0f} ms full "
              f"({got[True][3]} of {got[True][4]} prompt tokens from the cache)", flush=True)

    rec["loadavg_end"] = list(os.getloadavg())
    res = {"machine": rec, "model": a.model, "backend": a.backend, "policy": a.policy, "max_tokens": a.max_tokens,
           "threads": a.threads, "mismatches": mismatches, "cases": {}}
    lines = [f"# Prefix cache: time to first token, {a.model}", "", f"Machine: {machine_line(rec)}", "",
             f"Command: `{rec['command']}`", "",
             f"One request at a time, {a.policy} greedy, {a.max_tokens} tokens per answer; the engines with and "
             "without the prefix cache alternate request by request (warm-up excluded). Identical answers: "
             f"{'all' if not mismatches else f'NOT all ({len(mismatches)} differ)'}.", "",
             "| case | requests | mean prompt tokens | mean cached | TTFT ms, cache | TTFT ms, no cache | × faster |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for case, by in rows.items():
        # The first request of each case fills the cache; the mean is over the rest, the column says how many.
        on, off = by[True][1:], by[False][1:]
        if not on:
            continue
        t_on = statistics.mean(r[2] for r in on)
        t_off = statistics.mean(r[2] for r in off)
        cached = statistics.mean(r[3] for r in on)
        prompt = statistics.mean(r[4] for r in on)
        res["cases"][case] = {"requests": len(on), "prompt_tokens": prompt, "cached_tokens": cached,
                              "ttft_ms_cache": t_on * 1e3, "ttft_ms_no_cache": t_off * 1e3, "speedup": t_off / t_on,
                              "per_request": [{"prompt_tokens": x[4], "cached_tokens": x[3], "ttft_ms_cache": x[2] * 1e3,
                                               "ttft_ms_no_cache": y[2] * 1e3} for x, y in zip(by[True], by[False])]}
        lines.append(f"| {case} | {len(on)} | {prompt:.0f} | {cached:.0f} | {t_on * 1e3:.0f} | {t_off * 1e3:.0f} | "
                     f"{t_off / t_on:.2f} |")
    lines += ["", "The first request of each case (it fills the cache) is left out of the means."]
    md = "\n".join(lines) + "\n"
    print("\n" + md)
    write_table_and_results(a.out, md, res)
    for llm in engines.values():
        llm.shutdown()
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
