#!/usr/bin/env python3
"""Our backends x policies and the peer engines, side by side on the embedded model (issue #16).

    scripts/setup_peers.sh                       # once: peer venvs + converted models
    .venv/bin/python scripts/bench_peers.py [--rounds 2] [--spin] [--dir DIR] [--out docs/bench/peers]

Every engine runs as a long-lived worker in its own venv (ours in this interpreter), timed inside
the worker around the generate call only. Rows: every backend in ``recguide_trt.api.BACKENDS``
(those that fail to construct here are listed as not run, with the reason) x policies ar,
linearspec L8, recguide; the same policies on ``LLM()``'s default backend; every installed peer.
Same token-id prompts for all, greedy, EOS ignored, fp32, 2 threads; batch-1 (prompts one at a
time) and batch-N (N prompts submitted at once), interleaved rounds rotated per round.
Writes ``results.json`` and ``table.md`` (with the machine record) into ``--out``. Not run by CI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DIR = os.environ.get("RECGUIDE_PEERS_DIR", "/tmp/recguide-peers")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from recguide_trt.bench.peers.rows import OUR_POLICIES, PEERS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path(DEFAULT_DIR),
                    help=f"peer venvs and converted models (setup_peers.sh --dir; default {DEFAULT_DIR})")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "peers",
                    help="where results.json and table.md go (default docs/bench/peers)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; a row's tok/s is its best round")
    ap.add_argument("--serial-prompts", type=int, default=16, help="batch-1: prompts decoded one at a time")
    ap.add_argument("--batch-prompts", type=int, default=64, help="batched: prompts submitted at once")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per prompt (EOS ignored)")
    ap.add_argument("--workload", default="mixed", help="recguide_trt.bench.workloads name (default mixed)")
    ap.add_argument("--prompt-tokens", type=int, default=512, help="each prompt cut to its last N tokens")
    ap.add_argument("--threads", type=int, default=2, help="threads per engine (default 2)")
    ap.add_argument("--spin", action="store_true", default=os.environ.get("PEERS_SPIN", "0") == "1",
                    help="leave OpenMP spin-waiting on (right on a quiet machine; default: passive "
                         "waiting, right on a shared CPU; also PEERS_SPIN=1)")
    ap.add_argument("--backends", help="comma-separated backends of ours (default: all in api.BACKENDS)")
    ap.add_argument("--policies", help=f"comma-separated policies of ours (default: {', '.join(OUR_POLICIES)})")
    ap.add_argument("--peers", help=f"comma-separated peers (default: all: {', '.join(PEERS)})")
    ap.add_argument("--no-default", action="store_true", help="leave out the rows of LLM()'s default backend")
    ap.add_argument("--no-margins", action="store_true", help="skip our logit margins at greedy mismatches")
    a = ap.parse_args(argv)
    for name in ("rounds", "serial_prompts", "batch_prompts", "tokens", "prompt_tokens", "threads"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.policies and set(a.policies.split(",")) - set(OUR_POLICIES):
        ap.error(f"--policies: choose from {', '.join(OUR_POLICIES)}")
    if a.peers and set(a.peers.split(",")) - set(PEERS):
        ap.error(f"--peers: choose from {', '.join(PEERS)}")
    return a


def make_prompts(workload: str, n: int, max_tokens: int) -> list[list[int]]:
    """``n`` token-id prompts of the workload, tokenized with the embedded model's tokenizer."""
    from recguide_trt.bench.workloads import load_prompts
    from recguide_trt.model.tokenizer import Tokenizer
    from recguide_trt.models.names import EMBEDDED_MODEL

    tok = Tokenizer(EMBEDDED_MODEL / "tokenizer.json")
    prompts = load_prompts(workload, n, encode=tok.encode, vocab_size=4096, max_prompt_tokens=max_tokens,
                           avoid=(0, 1, 2, 3))
    if len(prompts) < n:
        raise SystemExit(f"the {workload} workload gave {len(prompts)} prompts, {n} needed")
    return prompts


def select_rows(a: argparse.Namespace) -> list:
    from recguide_trt.api import BACKENDS
    from recguide_trt.bench.peers import rows

    backends = a.backends.split(",") if a.backends else list(BACKENDS)
    ours = rows.our_rows(backends, default=not a.no_default)
    if a.policies:
        keep = set(a.policies.split(","))
        ours = [r for r in ours if r.label.split(" ", 2)[2] in keep]
    return ours + rows.peer_rows(a.peers.split(",") if a.peers else None)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    from recguide_trt.bench.peers import machine, near_ties, report
    from recguide_trt.bench.peers.client import Pool
    from recguide_trt.bench.peers.rows import reference_label
    from recguide_trt.bench.peers.run import run_bench

    rec = machine.record_start(REPO, ["scripts/bench_peers.py", *(sys.argv[1:] if argv is None else argv)])
    rows = select_rows(a)
    prompts = make_prompts(a.workload, max(a.serial_prompts, a.batch_prompts), a.prompt_tokens)
    log_dir = a.dir / "logs" if a.dir.is_dir() else Path(tempfile.gettempdir()) / "recguide-peers-logs"
    print(f"{len(rows)} rows, {len(prompts)} prompts, peers from {a.dir}, worker logs in {log_dir}", flush=True)
    pool = Pool(a.dir, log_dir, threads=a.threads, spin=a.spin)
    try:
        results = run_bench(rows, prompts, pool, rounds=a.rounds, serial_prompts=a.serial_prompts,
                            batch_prompts=a.batch_prompts, max_tokens=a.tokens, reference=reference_label(rows),
                            log=lambda s: print(s, flush=True))
    finally:
        pool.close()
    if not a.no_margins:
        near_ties.add_margins(results, prompts)
    rec = machine.record_end(rec, results)
    results["settings"].update(workload=a.workload, prompt_tokens=a.prompt_tokens, threads=a.threads,
                               omp_spin=a.spin, dtype="float32", greedy=True, ignore_eos=True)
    table = report.format_table(results)
    a.out.mkdir(parents=True, exist_ok=True)
    saved = {k: v for k, v in results.items() if k != "reference_outputs"}
    (a.out / "results.json").write_text(json.dumps({"machine": rec, **saved}, indent=1) + "\n")
    md = (f"# Peer benchmark\n\nMachine: {machine.machine_line(rec)}\n\nCommand: `{rec['command']}`\n\n{table}")
    (a.out / "table.md").write_text(md)
    print("\n" + md)
    print(f"-> {a.out / 'table.md'}, {a.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
