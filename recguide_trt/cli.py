"""``recguide`` command line: generate | serve | bench | export | build-engine | triton-repo | profile."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from .runtime.params import POLICIES


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="checkpoint directory (default: the embedded tiny NLD model)")
    from .backends.choice import BACKENDS

    p.add_argument("--backend", default=None, choices=BACKENDS,
                   help="default: native on the CPU in float32 (torch if it cannot be built), torch elsewhere")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default=None, help="float32 (default), bfloat16 or float16")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="recguide", choices=POLICIES,
                   help="decoding policy (the last four: other engines' speculation controllers, for comparison)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--block-size", type=int, default=None, help="draft block size (linearspec) / largest block")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)


def _params(args):
    from .runtime.params import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          seed=args.seed, policy=args.policy, block_size=args.block_size)


def cmd_generate(args) -> int:
    from .api import LLM

    llm = LLM(model=args.model, backend=args.backend, device=args.device, dtype=args.dtype)
    params = _params(args)
    if args.stream:
        handle = llm.submit(args.prompt, params)
        ids: list[int] = []
        printed = ""
        sys.stdout.write(args.prompt)
        for chunk in handle:
            ids.extend(chunk)
            text = llm.decode(ids)
            sys.stdout.write(text[len(printed):])
            sys.stdout.flush()
            printed = text
        req = handle.result()
        llm.shutdown()
        sys.stdout.write("\n")
        if req.error:
            print(f"error: {req.error}", file=sys.stderr)
            return 1
        metrics = req.metrics
    else:
        out = llm.generate([args.prompt], params)[0]
        if out.error:
            print(f"error: {out.error}", file=sys.stderr)
            return 1
        print(args.prompt + out.text)
        metrics = out.metrics
    if args.stats:
        print(json.dumps(metrics.as_dict(), indent=1, default=str), file=sys.stderr)
    return 0


def cmd_profile(args) -> int:
    from .api import LLM
    from .runtime.nvtx_ranges import record_trace

    llm = LLM(model=args.model, backend=args.backend, device=args.device, dtype=args.dtype)
    prompts = [f"def function_{i}(x):\n    " for i in range(args.requests)]
    params = _params(args)
    llm.generate(prompts[:1], params)  # warm-up (and cost calibration for recguide)
    before = llm.engine.stats()
    with record_trace(args.out):
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        wall = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    print(f"wrote {args.out}: {len(outs)} requests, {tokens} tokens in {wall:.2f} s "
          f"(open it in ui.perfetto.dev or chrome://tracing)")
    # The engine's counters are cumulative: report the traced workload only, not the warm-up request.
    print(json.dumps(stats_since(before, llm.engine.stats()), indent=1, default=str))
    return 0


def stats_since(before: dict, after: dict) -> dict:
    """``Engine.stats()`` of what ran between two snapshots (counts subtracted, RecGuide's state as of ``after``)."""
    def minus(x: dict, y: dict) -> dict:
        return {k: v - y.get(k, 0) for k, v in x.items() if v - y.get(k, 0)}

    tf = after["time_forward_s"] - before["time_forward_s"]
    ts = after["time_step_s"] - before["time_step_s"]
    blocks = {c: d for c, v in after["blocks_by_concurrency"].items()
              if (d := minus(v, before["blocks_by_concurrency"].get(c, {})))}
    return {"steps": after["steps"] - before["steps"], "time_forward_s": tf, "time_step_s": ts,
            "overhead_share": 1 - tf / ts if ts else None,
            "concurrency_hist": minus(after["concurrency_hist"], before["concurrency_hist"]),
            "blocks_by_concurrency": blocks, "recguide": after["recguide"]}


def cmd_export(args) -> int:
    from .api import resolve_model_path
    from .engine.export import export_onnx

    path = export_onnx(resolve_model_path(args.model), args.out, **({"opset": args.opset} if args.opset else {}))
    print(f"exported to {path}")
    return 0


def cmd_build_engine(args) -> int:
    from .engine.build import run

    return run(args)


def cmd_triton_repo(args) -> int:
    from .serving.triton_repo import run

    return run(args)


def cmd_serve(args) -> int:
    from .serving.openai_serve import serve_main

    return serve_main(args)


def cmd_bench(args) -> int:
    from .bench.sweep import run_bench

    return run_bench(args) or 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="recguide", description="RecGuide-TRT: diffusion-AR self-speculative decoding")
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="complete one prompt")
    g.add_argument("prompt")
    _add_model_args(g)
    _add_sampling_args(g)
    g.add_argument("--stream", action="store_true", help="print tokens as they are produced")
    g.add_argument("--stats", action="store_true", help="print MAL / TPF / forwards / timings to stderr")
    g.set_defaults(func=cmd_generate)

    from .serving.openai_serve import add_serve_args

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, streaming, /metrics)")
    add_serve_args(s)
    s.set_defaults(func=cmd_serve)

    b = sub.add_parser("bench", help="closed-loop concurrency sweep (tables and Pareto plot)")
    try:
        from .bench.sweep import add_bench_args

        add_bench_args(b)
    except ImportError:  # pragma: no cover - bench extra missing
        b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(func=cmd_bench)

    e = sub.add_parser("export", help="export the backbone to ONNX (+ manifest)")
    e.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    e.add_argument("--out", required=True, help="output directory")
    e.add_argument("--opset", type=int, default=None)
    e.set_defaults(func=cmd_export)

    # The two modules' own parsers, as parents (an argparse.REMAINDER positional here rejected every option).
    from .engine.build import build_parser as build_engine_parser
    from .serving.triton_repo import build_parser as triton_repo_parser

    _delegated(sub, "build-engine", build_engine_parser(), "build a TensorRT engine from an ONNX export (needs "
               "TensorRT)", cmd_build_engine)
    _delegated(sub, "triton-repo", triton_repo_parser(), "write a Triton Inference Server model repository",
               cmd_triton_repo)

    p = sub.add_parser("profile", help="run a short workload and write a Chrome/Perfetto trace")
    _add_model_args(p)
    _add_sampling_args(p)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--out", default="recguide_trace.json")
    p.set_defaults(func=cmd_profile, max_tokens=32)
    return ap


def _delegated(sub, name: str, parent: argparse.ArgumentParser, help: str, func) -> None:
    """A subcommand whose arguments are another module's parser (its --help and errors included)."""
    p = sub.add_parser(name, parents=[parent], add_help=False, help=help, description=parent.description)
    p.prog = f"recguide {name}"
    p.set_defaults(func=func)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record (not at the first ``main``)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # One-time work (the step-cost table) says what it is doing; stdout stays the command's output.
    log = logging.getLogger("recguide_trt")
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("recguide: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, NotADirectoryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
