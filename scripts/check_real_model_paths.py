#!/usr/bin/env python
"""The real model (SmolLM2-135M-Instruct, ``smollm2-135m``) through every serving path, with greedy parity.

Each section prints its wall times and one ``parity:`` line; the exit code is 1 when any parity
check fails (2 when a section cannot run here, e.g. Ray or Triton missing). Sections::

    onnx      recguide export --model M --out DIR; LLM(M, backend="onnxruntime", export_dir=DIR):
              ONNX Runtime AR, linearspec and recguide == the native backend's AR
    triton    recguide triton-repo --model M --backend native; a real tritonserver (nvidia-pytriton);
              chat + code prompts over HTTP generate_stream == LLM's AR
    ray       a 2-node loopback Ray cluster; recguide serve --model M --ray ADDR --replicas 2;
              /v1/chat/completions + /v1/completions == LLM's AR, and which replica answered
    lossless  every policy (linearspec at 2/4/8/16, recguide in both modes, the four peers) == AR on
              --device/--backend (scripts/gpu_check.sh runs it with --device cuda: torch CUDA)
    costs     the step-cost table at C = 1…64 measured on --device/--backend, printed

Default: ``onnx triton ray`` (the CPU paths; about 3-4 minutes on the 2-core CPU, most of it the
ONNX export). Examples::

    .venv/bin/python scripts/check_real_model_paths.py                      # onnx, triton, ray
    .venv/bin/python scripts/check_real_model_paths.py onnx --max-tokens 16
    python scripts/check_real_model_paths.py --device cuda lossless costs   # on a GPU machine
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the Ray cluster / server helpers live in tests/serving
    sys.path.insert(0, str(ROOT))

QUESTIONS = ["What is the capital of France?", "Explain what a hash table is in two sentences.",
             "Write a haiku about autumn.", "How do I reverse a list in Python?"]
SECTIONS = ("onnx", "triton", "ray", "lossless", "costs")
CPU_SECTIONS = ("onnx", "triton", "ray")
COST_BATCHES = (1, 2, 4, 8, 16, 32, 64)


# -- shared pieces (also used by tests/scripts/test_check_real_model_paths.py) --------------------
def synthetic_cost_table():
    """A fixed step-cost table: RecGuide runs without a start-up calibration (its block choices
    change, its greedy tokens must not)."""
    from recguide_trt.runtime.cost_model import CostTable

    batches, tokens = [1, 4, 16, 64], [1, 2, 4, 8, 16, 32]
    secs = [[b ** 0.3 * (1 + 0.02 * b * t / 8) * (1 + 0.01 * t) for t in tokens] for b in batches]
    return CostTable(batches, tokens, secs, {"synthetic": True})


def real_prompts(llm, n_chat: int = 2, n_code: int = 2) -> list[tuple[str, str]]:
    """``(kind, text)``: chat questions rendered with the model's chat template (plain questions when
    it has none) and HumanEval code prompts (their last 600 characters)."""
    from recguide_trt.bench.workloads import humaneval_prompts

    out = []
    for q in QUESTIONS[:n_chat]:
        try:
            out.append(("chat", llm.chat_prompt([{"role": "user", "content": q}])))
        except ValueError:  # no chat template (the tiny stand-in)
            out.append(("chat", q))
    out += [("code", p[-600:]) for p in humaneval_prompts()[:10 * n_code:10]]
    return out


def policy_grid(max_block: int) -> list[tuple[str, int | None]]:
    """Every policy once: linearspec at each block size up to ``max_block``, recguide, the four peers."""
    from recguide_trt.runtime.params import PEER_CONTROLLERS

    blocks = [b for b in (2, 4, 8, 16) if b <= max_block]
    return [("linearspec", b) for b in blocks] + [("recguide", None)] + [(p, None) for p in PEER_CONTROLLERS]


def logit_margin(model, ids: list[int]) -> float:
    """Top-1 minus top-2 logit of the next token after ``ids`` (batch-1 forward on the model's device)."""
    import torch

    from recguide_trt.model.masks import causal

    dev = next(model.parameters()).device
    n = len(ids)
    with torch.inference_mode():
        logits, _ = model(torch.tensor([ids], device=dev), torch.arange(n, device=dev)[None],
                          torch.from_numpy(causal(n))[None].to(dev))
    top = logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])


@dataclass
class Divergence:
    prompt: int
    token: int
    margin: float


@dataclass
class PolicyResult:
    label: str
    seconds: float
    mal: float
    divergences: list[Divergence] = field(default_factory=list)


def compare(llm, prompt_ids: list[list[int]], ref: list[list[int]], outs, label: str,
            seconds: float) -> PolicyResult:
    """``outs`` (RequestOutputs) against ``ref`` token ids; each divergence with the AR logit margin there."""
    import numpy as np

    from recguide_trt.runtime.reference import first_divergence

    res = PolicyResult(label, seconds, float(np.mean([o.metrics.mal for o in outs])))
    for i, (o, r) in enumerate(zip(outs, ref)):
        if o.error is not None:
            raise RuntimeError(f"{label}: prompt {i} failed: {o.error}")
        d = first_divergence(o.token_ids, r)
        if d is not None:
            res.divergences.append(Divergence(i, d, logit_margin(llm.checkpoint.model, prompt_ids[i] + r[:d])))
    return res


def check_every_policy(llm, prompt_ids: list[list[int]], max_tokens: int, overlap_llm=None,
                       log=print) -> tuple[list[list[int]], list[PolicyResult]]:
    """AR once, then every policy of :func:`policy_grid` (and recguide on ``overlap_llm``, an LLM whose
    RecGuide stays in overlap mode) on the same prompts. Returns the AR tokens and one result per policy."""
    from recguide_trt import SamplingParams

    t = time.perf_counter()
    ar = [o.token_ids for o in llm.generate(prompt_ids, SamplingParams(max_tokens=max_tokens, policy="ar"))]
    log(f"  ar: {time.perf_counter() - t:.2f} s, {sum(map(len, ar))} tokens")
    runs = [(llm, p, b, f"{p}" + (f" L={b}" if b else "")) for p, b in policy_grid(llm.engine.max_block)]
    if overlap_llm is not None:
        runs.append((overlap_llm, "recguide", None, "recguide (overlap)"))
    results = []
    for which, policy, block, label in runs:
        t = time.perf_counter()
        outs = which.generate(prompt_ids, SamplingParams(max_tokens=max_tokens, policy=policy, block_size=block))
        res = compare(llm, prompt_ids, ar, outs, label, time.perf_counter() - t)
        results.append(res)
        extra = "" if not res.divergences else "  " + "; ".join(
            f"prompt {d.prompt} token {d.token} (AR margin {d.margin:.2e})" for d in res.divergences)
        log(f"  {label:22s} {len(res.divergences)}/{len(prompt_ids)} diverge, MAL {res.mal:.2f}, "
            f"{res.seconds:.2f} s{extra}")
    return ar, results


def format_cost_table(table) -> str:
    """The table as text: one row per batch size C, one column per tokens-per-row, milliseconds
    (draft steps; plain steps in parentheses where they differ)."""
    head = f"{'C':>4} | " + " ".join(f"{'T=' + str(t):>15}" for t in table.tokens)
    lines = [head, "-" * len(head)]
    plain = table.plain or table.seconds
    for b, row, prow in zip(table.batches, table.seconds, plain):
        cells = []
        for s, p in zip(row, prow):
            cell = f"{s * 1e3:.2f}" + (f" ({p * 1e3:.2f})" if abs(s - p) > 1e-9 else "")
            cells.append(f"{cell:>15}")
        lines.append(f"{b:>4} | " + " ".join(cells))
    return "\n".join(lines)


def measure_costs(llm, batches=COST_BATCHES, tokens=None, past_len: int = 128, warmup: bool = True):
    """measure_cost_table on ``llm``'s backend (call only while no request runs) at C in ``batches``.

    ``warmup``: measure once and throw it away first. measure_cost_table keeps a cell's first forward
    as its time when that forward is long (LONG_PROBE_S), and a shape's first forward on a cold
    backend can be long for reasons of its own (cuBLAS handles and heuristics, the caching
    allocator growing, oneDNN primitives built per shape).
    """
    import inspect

    from recguide_trt.runtime.cost_model import DEFAULT_TOKENS, measure_cost_table

    kw = {}
    if "draft_adapter" in inspect.signature(measure_cost_table).parameters:
        kw["draft_adapter"] = llm.checkpoint.model.has_draft_adapter
    grid = dict(batches=tuple(batches), tokens=tuple(tokens or DEFAULT_TOKENS), past_len=past_len, progress=False,
                meta={"backend": llm.backend_name}, **kw)
    if warmup:
        measure_cost_table(llm.backend, **grid)
    return measure_cost_table(llm.backend, **grid)


# -- the script --------------------------------------------------------------------------------
class Report:
    def __init__(self):
        self.lines: list[str] = []
        self.failed = False
        self.skipped = False

    def parity(self, section: str, ok: bool, detail: str) -> None:
        line = f"parity: {section}: {'OK' if ok else 'FAILED'} ({detail})"
        print(line, flush=True)
        self.lines.append(line)
        self.failed |= not ok

    def skip(self, section: str, why: str) -> None:
        line = f"parity: {section}: NOT RUN ({why})"
        print(line, flush=True)
        self.lines.append(line)
        self.skipped = True


def timed(label: str):
    class _T:
        def __enter__(self):
            self.t0 = time.perf_counter()
            return self

        def __exit__(self, *exc):
            self.s = time.perf_counter() - self.t0
            if exc[0] is None:
                print(f"  {label}: {self.s:.1f} s", flush=True)
    return _T()


def recguide_cli() -> list[str]:
    script = Path(sys.executable).parent / "recguide"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "recguide_trt.cli"]


def run_cli(*args: str) -> str:
    res = subprocess.run([*recguide_cli(), *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"recguide {' '.join(args)} exited with {res.returncode}:\n{res.stderr[-3000:]}")
    return res.stdout


class Reference:
    """The native backend's (CPU, float32) AR greedy answers to the prompts: what every path must reproduce."""

    def __init__(self, model: str, max_tokens: int, n_chat: int, n_code: int):
        from recguide_trt import LLM, EngineConfig, SamplingParams

        with timed("reference LLM load"):
            self.llm = LLM(model, engine_config=EngineConfig(max_num_seqs=8, max_model_len=1024,
                                                              cost_table=synthetic_cost_table()))
        print(f"  reference backend: {self.llm.backend_name}", flush=True)
        self.prompts = real_prompts(self.llm, n_chat, n_code)
        self.questions = QUESTIONS[:n_chat] + [None] * n_code
        """The user message of each chat prompt (the Ray section sends it to /v1/chat/completions)."""
        self.ids = [self.llm.encode(text) for _, text in self.prompts]
        self.max_tokens = max_tokens
        with timed(f"reference AR ({len(self.ids)} prompts x {max_tokens} tokens)"):
            self.ar = [o.token_ids for o in self.llm.generate(self.ids, SamplingParams(max_tokens=max_tokens,
                                                                                       policy="ar"))]
        for (kind, _), toks in zip(self.prompts, self.ar):
            print(f"  [{kind}] {self.llm.decode(toks)[:70]!r}", flush=True)


def section_onnx(ref: Reference, args, work: Path, report: Report) -> None:
    from recguide_trt import LLM, EngineConfig, SamplingParams
    from recguide_trt.engine.manifest import ExportManifest

    if args.onnx_export == "cli":
        out = work / "onnx"
        with timed(f"recguide export --model {args.model} --out {out}"):
            run_cli("export", "--model", args.model, "--out", str(out))
        man = ExportManifest.load(out)
        size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
        print(f"  export: {size:.0f} MB, max_model_len {man.max_model_len}, blocks {man.block_sizes}, "
              f"exporter {man.exporter.get('seconds')} s", flush=True)
        with timed("LLM(backend='onnxruntime', export_dir=...) load"):
            llm = LLM(args.model, backend="onnxruntime", export_dir=str(out), engine_config=EngineConfig(
                max_num_seqs=8, max_model_len=1024, max_block_size=max(man.block_sizes),
                cost_table=synthetic_cost_table()))
    else:  # LLM exports on the fly into its cache, with profiles for its own engine settings
        with timed("LLM(backend='onnxruntime') load, exporting into the cache"):
            llm = LLM(args.model, backend="onnxruntime", cache_dir=str(work / "onnx-cache"), engine_config=EngineConfig(
                max_num_seqs=8, max_model_len=1024, cost_table=synthetic_cost_table()))
        man = llm.backend.manifest
        print(f"  export {llm.backend.export_dir}: max_model_len {man.max_model_len}, blocks {man.block_sizes}, "
              f"exporter {man.exporter.get('seconds')} s", flush=True)
    bad = []
    for policy in ("ar", "linearspec", "recguide"):
        with timed(f"onnxruntime {policy}"):
            outs = llm.generate(ref.ids, SamplingParams(max_tokens=ref.max_tokens, policy=policy))
        got = [o.token_ids for o in outs]
        diff = [i for i, (g, r) in enumerate(zip(got, ref.ar)) if g != r]
        bad += [f"{policy} prompt {i}" for i in diff]
    llm.shutdown()
    del llm
    gc.collect()
    report.parity("onnx", not bad, f"onnxruntime ar/linearspec/recguide vs native AR on {len(ref.ids)} prompts"
                  + (f"; differ: {', '.join(bad)}" if bad else ""))


def _triton_generate(url: str, text: str, max_tokens: int, policy: str) -> list[int]:
    body = json.dumps({"text_input": text, "max_tokens": max_tokens, "policy": policy, "stream": True}).encode()
    req = urllib.request.Request(f"http://{url}/v2/models/recguide/generate_stream", data=body,
                                 headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
    errors = [e["error"] for e in events if "error" in e]
    if errors or not events:
        raise RuntimeError(f"triton request failed: {errors or 'no events'}")
    ids = events[-1]["output_token_ids"]
    return ids if isinstance(ids, list) else [ids]


def section_triton(ref: Reference, args, work: Path, report: Report) -> None:
    from recguide_trt.serving import triton_repo

    python = os.environ.get("RECGUIDE_TRITON_PYTHON", sys.executable)
    problem = triton_repo.hosting_problem(python)
    if problem:
        report.skip("triton", problem)
        return
    repo = work / "triton-repo"
    with timed(f"recguide triton-repo --model {args.model} --backend native"):
        run_cli("triton-repo", "--model", args.model, "--out", str(repo), "--backend", "native",
                "--policy", "linearspec", "--max-num-seqs", "4", "--max-model-len", "1024")
    pbtxt = (repo / "recguide" / "config.pbtxt").read_text()
    model_path = next(line for line in pbtxt.splitlines() if '"model_path"' in line)
    print(f"  config.pbtxt: {model_path.strip()}", flush=True)
    srv = triton_repo.TritonServer(repo, python=python, log_path=work / "tritonserver.log", env=dict(os.environ))
    bad, t_req = [], 0.0
    try:
        with timed("tritonserver start until the model is ready"):
            srv.start()
            srv.wait_ready(timeout=600)
        for i, ((kind, text), want) in enumerate(zip(ref.prompts, ref.ar)):
            t = time.perf_counter()
            got = _triton_generate(srv.http_url, text, ref.max_tokens, "linearspec")
            t_req += time.perf_counter() - t
            if got != want:
                bad.append(f"prompt {i} ({kind})")
        print(f"  {len(ref.prompts)} requests (linearspec, one at a time): {t_req:.1f} s", flush=True)
    finally:
        with timed("tritonserver stop"):
            code = srv.stop()
    if code != 0:
        print(f"  warning: tritonserver exit code {code}; log: {srv.log_path}", flush=True)
    report.parity("triton", not bad, f"linearspec through tritonserver (backend native) vs LLM AR on "
                  f"{len(ref.prompts)} prompts" + (f"; differ: {', '.join(bad)}" if bad else ""))


def _ray_request(http, ref: Reference, i: int) -> tuple[list[int] | None, str]:
    """Prompt ``i`` as a chat (the question, templated by the server) or a completion; (token ids, replica)."""
    kind, text = ref.prompts[i]
    body = {"model": ref.llm.checkpoint.path.name, "max_tokens": ref.max_tokens, "temperature": 0, "policy": "linearspec",
            "return_token_ids": True}
    if kind == "chat":
        r = http.post("/v1/chat/completions", json=dict(body, messages=[{"role": "user", "content": ref.questions[i]}]))
    else:
        r = http.post("/v1/completions", json=dict(body, prompt=text))
    if r.status_code != 200:
        raise RuntimeError(f"ray request {i}: HTTP {r.status_code}: {r.text[:500]}")
    return r.json()["choices"][0].get("token_ids"), r.headers.get("x-recguide-replica", "?")


def section_ray(ref: Reference, args, work: Path, report: Report) -> None:
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError as exc:
        report.skip("ray", f"ray[serve] is not importable ({exc})")
        return
    import httpx

    from tests.serving.openai_server import ServerProcess, metric, parse_metrics
    from tests.serving.ray_cluster import CLUSTER_ENV, RayCluster

    with timed("2-node loopback Ray cluster start"):
        cluster = RayCluster(cpus=(1, 1))
    bad, replicas = [], {}
    try:
        with timed(f"recguide serve --model {args.model} --ray ... --replicas 2 until /health"):
            # Half the requests per replica at most (max_ongoing_requests = --max-num-seqs): Ray Serve's router
            # prefers the replica on the proxy's node while it has room, so all at once then reach both.
            slots = str(max(1, len(ref.prompts) // 2))
            srv = ServerProcess("--model", args.model, "--ray", cluster.address, "--replicas", "2",
                                "--max-num-seqs", slots, "--max-model-len", "1024", "--no-warmup",
                                startup_s=600, env=CLUSTER_ENV)
        try:
            # /health answers as soon as one replica is up; the other may still be loading the model.
            with timed("until both replicas report"):
                deadline = time.monotonic() + 300
                while metric(parse_metrics(srv.url), "recguide:replicas_reporting") < 2:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the second replica did not come up:\n{srv.output()[-3000:]}")
                    time.sleep(1)
            t = time.perf_counter()
            with httpx.Client(base_url=srv.url, timeout=300) as http, ThreadPoolExecutor(len(ref.prompts)) as pool:
                # All at once, so that Ray Serve's router spreads them over both replicas.
                answers = list(pool.map(lambda i: _ray_request(http, ref, i), range(len(ref.prompts))))
            for i, ((kind, _), want, (got, replica)) in enumerate(zip(ref.prompts, ref.ar, answers)):
                replicas[replica] = replicas.get(replica, 0) + 1
                if got != want:
                    bad.append(f"prompt {i} ({kind})")
            print(f"  {len(ref.prompts)} concurrent requests (linearspec): {time.perf_counter() - t:.1f} s; "
                  f"answered by replicas {replicas}", flush=True)
        finally:
            with timed("recguide serve stop"):
                rc = srv.stop(timeout=60)
            if rc != 0:
                print(f"  warning: recguide serve exit code {rc}:\n{srv.output()[-2000:]}", flush=True)
    finally:
        with timed("Ray cluster stop"):
            left = cluster.stop()
        if left:
            print(f"  warning: Ray processes left: {left}", flush=True)
    report.parity("ray", not bad, f"/v1/chat/completions + /v1/completions (linearspec) vs LLM AR on "
                  f"{len(ref.prompts)} prompts, answered by {len(replicas)} of 2 replicas"
                  + (f"; differ: {', '.join(bad)}" if bad else ""))


def section_lossless_and_costs(args, sections: list[str], report: Report) -> None:
    from recguide_trt import LLM, EngineConfig
    from recguide_trt.runtime.policies.recguide import RecGuideConfig

    where = f"{args.device}/{args.backend or 'default backend'}"
    slots = max(COST_BATCHES) if "costs" in sections else 8
    table = synthetic_cost_table() if args.cost_table == "synthetic" else None
    with timed(f"LLM({args.model!r}, device={args.device!r}) load"):
        llm = LLM(args.model, backend=args.backend, device=args.device, dtype=args.dtype, engine_config=EngineConfig(
            max_num_seqs=slots, max_model_len=1024, cost_table=table))
    print(f"  backend: {llm.backend_name}", flush=True)
    if "costs" in sections:
        with timed(f"step-cost table on {llm.backend_name} {args.device}"):
            costs = measure_costs(llm, batches=[b for b in COST_BATCHES if b <= args.max_cost_batch],
                                  tokens=args.cost_tokens)
        print(f"step-cost table, {args.model} on {llm.backend_name} {args.device} (ms per step; batch C rows x T "
              f"new tokens each, past {costs.meta.get('past_len')}; draft-free steps in parentheses):")
        print(format_cost_table(costs), flush=True)
    if "lossless" in sections:
        prompts = real_prompts(llm, args.chat_prompts, args.code_prompts)
        ids = [llm.encode(text) for _, text in prompts]
        with timed("LLM load (RecGuide pinned to overlap mode)"):
            overlap = LLM(args.model, backend=args.backend, device=args.device, dtype=args.dtype,
                          engine_config=EngineConfig(max_num_seqs=8, max_model_len=1024, cost_table=table,
                                                     recguide=RecGuideConfig(switch_concurrency=1000)))
        print(f"every policy vs AR on {where}: {len(ids)} prompts x {args.max_tokens} tokens", flush=True)
        _, results = check_every_policy(llm, ids, args.max_tokens, overlap_llm=overlap)
        overlap.shutdown()
        divs = [(r.label, d) for r in results for d in r.divergences]
        hard = [(label, d) for label, d in divs if abs(d.margin) >= args.near_tie]
        detail = f"{len(results)} policies x {len(ids)} prompts on {where}"
        if divs:
            detail += (f"; {len(divs)} divergence(s), {len(divs) - len(hard)} at AR near-ties (margin < "
                       f"{args.near_tie:g})")
        report.parity("lossless", not hard, detail)
    llm.shutdown()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sections", nargs="*", metavar="SECTION",
                   help=f"any of {', '.join(SECTIONS)} (default: {' '.join(CPU_SECTIONS)})")
    p.add_argument("--model", default="smollm2-135m", help="a model name or checkpoint directory")
    p.add_argument("--max-tokens", type=int, default=24, help="tokens per answer (default 24)")
    p.add_argument("--chat-prompts", type=int, default=2, help="chat questions (at most 4)")
    p.add_argument("--code-prompts", type=int, default=2, help="HumanEval code prompts")
    p.add_argument("--work", default=None, help="directory for the export, repository and logs, kept (default: a "
                                                "temporary one, removed at the end)")
    p.add_argument("--onnx-export", default="cli", choices=["cli", "llm"],
                   help="onnx: export with `recguide export` and load it with export_dir= (cli), or let "
                        "LLM(backend='onnxruntime') export on the fly into its cache (llm)")
    p.add_argument("--device", default="cpu", help="lossless/costs: cpu or cuda")
    p.add_argument("--backend", default=None, help="lossless/costs: the backend (default: LLM's choice)")
    p.add_argument("--dtype", default=None, help="lossless/costs: float32 (default), bfloat16, float16")
    p.add_argument("--cost-table", default="measured", choices=["measured", "synthetic"],
                   help="lossless: the engines' step-cost table (measured at the first RecGuide request, as "
                        "LLM() does, or a fixed synthetic one)")
    p.add_argument("--max-cost-batch", type=int, default=64, help="costs: the largest C measured")
    p.add_argument("--cost-tokens", type=lambda v: [int(x) for x in v.split(",")], default=None,
                   help="costs: comma-separated tokens per row (default: the engine's grid, 1..64)")
    p.add_argument("--near-tie", type=float, default=1e-5,
                   help="lossless: a divergence where AR's top-1/top-2 logit margin is below this is reported, "
                        "not failed (DESIGN.md §2's near-tie)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    sections = list(dict.fromkeys(args.sections or CPU_SECTIONS))
    if args.work:
        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        return run_sections(args, sections, work)
    with tempfile.TemporaryDirectory(prefix="rg-real-") as tmp:  # the export alone is 650 MB: not left behind
        return run_sections(args, sections, Path(tmp))


def run_sections(args, sections: list[str], work: Path) -> int:
    print(f"model {args.model}; sections {' '.join(sections)}; work dir {work}", flush=True)
    report = Report()
    t0 = time.perf_counter()
    paths = [s for s in sections if s in CPU_SECTIONS]
    if paths:
        print("\n== reference ==", flush=True)
        ref = Reference(args.model, args.max_tokens, args.chat_prompts, args.code_prompts)
        for s in paths:
            print(f"\n== {s} ==", flush=True)
            t = time.perf_counter()
            {"onnx": section_onnx, "triton": section_triton, "ray": section_ray}[s](ref, args, work, report)
            print(f"  {s} section: {time.perf_counter() - t:.1f} s", flush=True)
        ref.llm.shutdown()
        del ref
        gc.collect()
    if "lossless" in sections or "costs" in sections:
        print("\n== " + " + ".join(s for s in sections if s in ("lossless", "costs")) + " ==", flush=True)
        section_lossless_and_costs(args, sections, report)
    print(f"\n== summary ({time.perf_counter() - t0:.0f} s) ==")
    for line in report.lines:
        print(line)
    return 1 if report.failed else (2 if report.skipped else 0)

if __name__ == "__main__":
    sys.exit(main())
