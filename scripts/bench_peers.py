#!/usr/bin/env python3
"""Our backends x policies and the peer engines, side by side on one model (issue #16).

    scripts/setup_peers.sh [--model M]           # once per model: peer venvs + converted models
    .venv/bin/python scripts/bench_peers.py [--model M] [--rounds 2] [--spin] [--dir DIR] [--out docs/bench/peers]

``--model``: ``tiny`` (the embedded stand-in, the default), ``smollm2-135m`` or a checkpoint directory;
its peer conversions are those ``setup_peers.sh --model`` made (``DIR/<model>/...``, ``DIR`` for tiny).

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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DIR = os.environ.get("RECGUIDE_PEERS_DIR", "/tmp/recguide-peers")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from recguide_trt.bench.peers.rows import EMBEDDED, OUR_POLICIES, PEER_SPEC, PEERS, PRECISIONS
    from recguide_trt.models.names import MODEL_HELP, NAMED_MODELS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=EMBEDDED,
                    help=f"{MODEL_HELP} (default here: {EMBEDDED}); the same as setup_peers.sh --model")
    ap.add_argument("--dir", type=Path, default=Path(DEFAULT_DIR),
                    help=f"peer venvs and converted models (setup_peers.sh --dir; default {DEFAULT_DIR})")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "peers",
                    help="where results.json and table.md go (default docs/bench/peers)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds; a row's tok/s is its best round")
    ap.add_argument("--serial-prompts", type=int, default=16, help="batch-1: prompts decoded one at a time")
    ap.add_argument("--batch-prompts", type=int, default=64, help="batched: prompts submitted at once")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per prompt (EOS ignored)")
    ap.add_argument("--workload", help="recguide_trt.bench.workloads name (default: chat-code for a model with a "
                                       "chat template, else mixed)")
    ap.add_argument("--prompt-tokens", type=int, default=512, help="each prompt cut to its last N tokens")
    ap.add_argument("--snippet-chars", type=int, default=600,
                    help="longest code snippet of the stdlib/mixed/chat-code workloads, in characters (default 600; "
                         "~2400 gives code prompts of ~512 tokens)")
    ap.add_argument("--threads", type=int, default=2, help="threads per engine (default 2)")
    ap.add_argument("--spin", action="store_true", default=os.environ.get("PEERS_SPIN", "0") == "1",
                    help="leave OpenMP spin-waiting on (right on a quiet machine; default: passive "
                         "waiting, right on a shared CPU; also PEERS_SPIN=1)")
    ap.add_argument("--backends", help="comma-separated backends of ours (default: all in api.BACKENDS)")
    ap.add_argument("--policies", help=f"comma-separated policies of ours (default: {', '.join(OUR_POLICIES)})")
    ap.add_argument("--peers", help=f"comma-separated peers (default: all: {', '.join(PEERS)}); also their "
                                    f"speculation rows: {', '.join(PEER_SPEC)}")
    ap.add_argument("--spec-peers", action="store_true",
                    help="add the selected peers' own n-gram / prompt-lookup speculation rows")
    ap.add_argument("--no-default", action="store_true", help="leave out the rows of LLM()'s default backend")
    ap.add_argument("--precision", choices=PRECISIONS, default="float32",
                    help="float32 (default): every engine forced to float32 arithmetic; default: each peer as it "
                         "runs by default (vLLM, OpenVINO GenAI, transformers: the checkpoint's bf16), plus our rows "
                         "with bf16 compute + KV (labelled bf16)")
    ap.add_argument("--kv16", action="store_true",
                    help="add our rows again with float32 arithmetic over a bf16 KV cache (labelled kv16): our "
                         "counterpart of a peer's smaller default KV cache (OpenVINO GenAI's u8 on CPU), and our "
                         "high-load setting on CPUs without a bf16 dot")
    ap.add_argument("--no-margins", action="store_true", help="skip our logit margins at greedy mismatches")
    a = ap.parse_args(argv)
    for name in ("rounds", "serial_prompts", "batch_prompts", "tokens", "prompt_tokens", "snippet_chars", "threads"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.model not in NAMED_MODELS and not Path(a.model).expanduser().is_dir():
        ap.error(f"--model: {a.model!r} is neither a model name ({', '.join(NAMED_MODELS)}) nor a checkpoint directory")
    if a.policies and set(a.policies.split(",")) - set(OUR_POLICIES):
        ap.error(f"--policies: choose from {', '.join(OUR_POLICIES)}")
    if a.peers and set(a.peers.split(",")) - set(PEERS) - set(PEER_SPEC):
        ap.error(f"--peers: choose from {', '.join([*PEERS, *PEER_SPEC])}")
    return a


def default_workload(model_dir: Path) -> str:
    """chat-code (chat-template instructions and code) for a model with a chat template, else mixed."""
    from recguide_trt.model.chat_template import load_chat_template

    return "chat-code" if load_chat_template(model_dir) else "mixed"


def make_prompts(workload: str, n: int, max_tokens: int, model_dir: Path | None = None,
                 snippet_chars: int = 600) -> list[list[int]]:
    """``n`` token-id prompts of the workload, tokenized with the model's tokenizer (default: the embedded
    model's); chat workloads in its chat template."""
    from recguide_trt.bench.workloads import load_prompts
    from recguide_trt.model.chat_template import load_chat_template
    from recguide_trt.model.tokenizer import Tokenizer
    from recguide_trt.models.names import EMBEDDED_MODEL

    model_dir = Path(model_dir or EMBEDDED_MODEL)
    cfg = json.loads((model_dir / "config.json").read_text())
    render = load_chat_template(model_dir)
    tok = Tokenizer(model_dir / "tokenizer.json")
    avoid = tuple(sorted({cfg[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id", "mask_token_id") if k in cfg}))
    prompts = load_prompts(workload, n, encode=tok.encode, vocab_size=cfg["vocab_size"], max_prompt_tokens=max_tokens,
                           snippet_chars=snippet_chars, avoid=avoid, render_chat=render)
    if len(prompts) < n:
        raise SystemExit(f"the {workload} workload gave {len(prompts)} prompts, {n} needed")
    return prompts


def select_rows(a: argparse.Namespace) -> list:
    from recguide_trt.api import BACKENDS
    from recguide_trt.bench.peers import rows

    backends = a.backends.split(",") if a.backends else list(BACKENDS)
    ours = rows.our_rows(backends, default=not a.no_default, model=a.model, bf16=a.precision == "default",
                         kv16=a.kv16)
    if a.policies:
        keep = set(a.policies.split(","))
        def policy(label: str) -> str:  # "ours BACKEND POLICY[ SUFFIX]"; a policy may hold a space ("linearspec L8")
            rest = label.split(" ", 2)[2]
            return next((rest.removesuffix(sfx) for sfx in rows.OUR_SUFFIXES if rest.endswith(sfx)), rest)

        ours = [r for r in ours if policy(r.label) in keep]
    return ours + rows.peer_rows(a.peers.split(",") if a.peers else None, spec=a.spec_peers, precision=a.precision,
                                 model=a.model)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    from recguide_trt.bench.peers import machine, near_ties, report
    from recguide_trt.bench.peers.client import Pool
    from recguide_trt.bench.peers.rows import model_files, reference_label, worker_log_dir
    from recguide_trt.bench.peers.run import run_bench
    from recguide_trt.models import resolve_model

    rec = machine.record_start(REPO, ["scripts/bench_peers.py", *(sys.argv[1:] if argv is None else argv)])
    try:
        model_dir = resolve_model(a.model)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise SystemExit(f"bench_peers.py: --model: {exc}") from None
    rows = select_rows(a)
    workload = a.workload or default_workload(model_dir)
    prompts = make_prompts(workload, max(a.serial_prompts, a.batch_prompts), a.prompt_tokens, model_dir,
                           a.snippet_chars)
    files = model_files(a.dir, a.model)
    log_dir = worker_log_dir(files)
    lens = sorted(map(len, prompts))
    print(f"{len(rows)} rows; model {a.model} ({model_dir}); {len(prompts)} {workload} prompts of {lens[0]}-{lens[-1]} "
          f"tokens (median {lens[len(lens) // 2]}); peers from {a.dir}, conversions in {files}, worker logs in "
          f"{log_dir}", flush=True)
    if not (files / "hf-llama").is_dir():
        print(f"note: no {files / 'hf-llama'}: the peers will not load; run scripts/setup_peers.sh --model {a.model}",
              flush=True)
    pool = Pool(a.dir, log_dir, threads=a.threads, spin=a.spin, models_dir=files)
    try:
        results = run_bench(rows, prompts, pool, rounds=a.rounds, serial_prompts=a.serial_prompts,
                            batch_prompts=a.batch_prompts, max_tokens=a.tokens, reference=reference_label(rows),
                            log=lambda s: print(s, flush=True))
    finally:
        pool.close()
    if not a.no_margins:
        near_ties.add_margins(results, prompts, model_dir)
    rec = machine.record_end(rec, results)
    results["settings"].update(model=a.model, workload=workload, prompt_tokens=a.prompt_tokens,
                               snippet_chars=a.snippet_chars, threads=a.threads,
                               omp_spin=a.spin, precision=a.precision, greedy=True, ignore_eos=True)
    table = report.format_table(results)
    a.out.mkdir(parents=True, exist_ok=True)
    saved = {k: v for k, v in results.items() if k != "reference_outputs"}
    (a.out / "results.json").write_text(json.dumps({"machine": rec, **saved}, indent=1) + "\n")
    md = (f"# Peer benchmark\n\nModel: {a.model}; {workload} prompts, {lens[0]}-{lens[-1]} tokens\n\n"
          f"Machine: {machine.machine_line(rec)}\n\nCommand: `{rec['command']}`\n\n{table}")
    (a.out / "table.md").write_text(md)
    print("\n" + md)
    print(f"-> {a.out / 'table.md'}, {a.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
