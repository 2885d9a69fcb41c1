#!/usr/bin/env python3
"""Tune the peers' own speculation (prompt_lookup x ngram) on training prompts, at batch 1 (issue #25).

    scripts/setup_peers.sh --model smollm2-135m ov vllm            # once
    .venv/bin/python scripts/tune_peer_spec.py --model smollm2-135m \\
        --peers 'OpenVINO GenAI prompt lookup,vLLM CPU ngram' --prompt-lookup 3,5,8 --ngram 2,3,4 --write

Prompts come from the *training* split (``--workload chat-code-train`` by default: chat instructions and
code from standard-library files the benchmark's held-out prompts never come from). Every grid point gets
an engine process of its own (closed before the next starts: a dozen vLLM processes would not fit in
memory), a warm-up, then ``--rounds`` timed passes over ``--prompts`` prompts one at a time; its rate is the
best pass. Writes ``table.md`` and ``results.json`` into ``--out``; ``--write`` records each peer's fastest
point in ``recguide_trt/bench/peers/spec_tuned.json``, which ``bench_peers.py`` then uses for that model's
speculation rows. Not run by CI (the peers' venvs are not installed there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from bench_peers import DEFAULT_DIR, make_prompts  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from recguide_trt.bench.peers.rows import PEER_SPEC
    from recguide_trt.bench.peers.spec_tuning import parse_grid
    from recguide_trt.models.names import MODEL_HELP

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help=MODEL_HELP)
    ap.add_argument("--peers", default=",".join(PEER_SPEC), help=f"speculation rows to tune (default: all: "
                                                                 f"{', '.join(PEER_SPEC)})")
    ap.add_argument("--prompt-lookup", default="3,5,8", help="draft tokens per step to try (default 3,5,8)")
    ap.add_argument("--ngram", default="2,3,4", help="longest n-gram matched, values to try (default 2,3,4)")
    ap.add_argument("--workload", default="chat-code-train", help="a training-split workload (default chat-code-train)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts decoded one at a time per pass (default 8)")
    ap.add_argument("--tokens", type=int, default=96, help="new tokens per prompt (default 96)")
    ap.add_argument("--prompt-tokens", type=int, default=512, help="each prompt cut to its last N tokens")
    ap.add_argument("--snippet-chars", type=int, default=2400, help="characters per code snippet (default 2400)")
    ap.add_argument("--rounds", type=int, default=1, help="timed passes per point; its rate is the best (default 1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spin", action="store_true", default=os.environ.get("PEERS_SPIN", "0") == "1",
                    help="OpenMP workers spin between calls, as in bench_peers.py --spin (default: $PEERS_SPIN=1)")
    ap.add_argument("--dir", type=Path, default=Path(DEFAULT_DIR), help="the peers dir (setup_peers.sh)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "peer-spec-tuning")
    ap.add_argument("--write", action="store_true", help="record the winners in spec_tuned.json")
    a = ap.parse_args(argv)
    labels = [s.strip() for s in a.peers.split(",") if s.strip()]
    unknown = sorted(set(labels) - set(PEER_SPEC))
    if not labels or unknown:
        ap.error(f"--peers: choose from {', '.join(PEER_SPEC)} (got {', '.join(unknown) or 'none'})")
    if "train" not in a.workload:
        ap.error(f"--workload: tune on a training-split workload (…-train), not {a.workload!r}: the benchmark's "
                 f"held-out prompts must not choose its peers' settings")
    for name in ("prompts", "tokens", "prompt_tokens", "snippet_chars", "rounds", "threads"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    try:
        a.lookups, a.ngrams = parse_grid(a.prompt_lookup, "--prompt-lookup"), parse_grid(a.ngram, "--ngram")
    except ValueError as exc:
        ap.error(str(exc))
    a.labels = labels
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    from recguide_trt.bench.peers import machine
    from recguide_trt.bench.peers.client import Pool
    from recguide_trt.bench.peers.rows import PEER_SPEC, Row, model_files, worker_log_dir
    from recguide_trt.bench.peers.spec_tuning import best, save_tuned, tune
    from recguide_trt.models import resolve_model

    rec = machine.record_start(REPO, ["scripts/tune_peer_spec.py", *(sys.argv[1:] if argv is None else argv)])
    model_dir = resolve_model(a.model)
    prompts = make_prompts(a.workload, a.prompts, a.prompt_tokens, model_dir, a.snippet_chars)
    files = model_files(a.dir, a.model)
    log_dir = worker_log_dir(files)

    def measure(label: str, opts: dict) -> float:
        adapter, venv, _ = PEER_SPEC[label]
        row = Row(label, adapter, opts, venv=venv)
        pool = Pool(a.dir, log_dir, threads=a.threads, spin=a.spin, models_dir=files)
        try:
            w = pool.get(row)
            w.generate("serial", prompts[:2], min(16, a.tokens))  # warm-up
            rates = []
            for _ in range(a.rounds):
                reply = w.generate("serial", prompts, a.tokens)
                rates.append(reply["tokens"] / reply["elapsed_s"])
            return max(rates)
        finally:
            pool.close()

    t0 = time.perf_counter()
    results = tune(a.labels, a.lookups, a.ngrams, measure, log=lambda s: print(s, flush=True))
    rec = machine.record_end(rec, {"rows": {}})
    lines = ["| peer | prompt_lookup | ngram | batch-1 tok/s |", "|---|---:|---:|---:|"]
    winners = {}
    for label, points in results.items():
        top = best(points)
        if top is not None:
            winners[label] = top.opts
        for p in points:
            rate = "failed: " + p.error if p.tok_s is None else f"{p.tok_s:.1f}" + (" **best**" if p == top else "")
            lines.append(f"| {label} | {p.prompt_lookup} | {p.ngram} | {rate} |")
    md = (f"# The peers' speculation settings, tuned on training prompts\n\nModel: {a.model}; {a.prompts} "
          f"{a.workload} prompts (≤ {a.prompt_tokens} tokens) one at a time, {a.tokens} new tokens, greedy; best of "
          f"{a.rounds} pass(es) per point, one engine process per point.\n\nMachine: {machine.machine_line(rec)}\n\n"
          f"Command: `{rec['command']}`\n\n" + "\n".join(lines) + "\n")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "table.md").write_text(md)
    (a.out / "results.json").write_text(json.dumps({
        "machine": rec, "winners": winners,
        "points": {label: [p.__dict__ for p in points] for label, points in results.items()}}, indent=1) + "\n")
    print("\n" + md)
    if a.write and winners:
        save_tuned(a.model, winners, {"command": rec["command"], "machine": machine.machine_line(rec),
                                      "workload": a.workload, "table": str(a.out.relative_to(REPO)
                                                                           if a.out.is_relative_to(REPO) else a.out)})
        print(f"recorded in recguide_trt/bench/peers/spec_tuned.json: {json.dumps(winners)}")
    print(f"-> {a.out / 'table.md'} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
