"""``recguide serve``: build one LLM, warm it up, serve the OpenAI app with uvicorn."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import threading

from ..models.names import MODEL_HELP

log = logging.getLogger("recguide_trt.serve")


def add_serve_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--model", default=None, help=MODEL_HELP)
    from ..backends.choice import BACKENDS, add_native_dtype_args

    p.add_argument("--backend", default=None, choices=BACKENDS,
                   help="default: native on the CPU in float32 (torch if it cannot be built), torch elsewhere")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default=None, help="float32 (default), bfloat16 or float16")
    add_native_dtype_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--max-num-seqs", type=int, default=64, help="requests decoded concurrently (KV slots)")
    p.add_argument("--max-model-len", type=int, default=None, help="prompt + output tokens per request")
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="prefill every prompt in full, even a prefix a KV slot still holds (for benchmarks that "
                        "replay prompts: the cache would skip their prefills)")
    p.add_argument("--max-queue", type=int, default=None,
                   help="requests allowed to wait for a slot; beyond it the server answers 503 (default: no limit)")
    p.add_argument("--served-model-name", default=None, help="the model name clients send (default: the "
                                                             "checkpoint directory's name)")
    p.add_argument("--recguide", action="append", default=None, metavar="FIELD=VALUE",
                   help="set a field of the RecGuide policy's config (RecGuideConfig; repeatable), e.g. "
                        "--recguide switch_concurrency=0 (the adaptive mode at every load); every replica with --ray")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the start-up request (which measures RecGuide's step-cost table when not cached)")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (info logs every request)")
    from .ray_serve import add_ray_args

    add_ray_args(p)
    return p


def _quiet_exit_server():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGTERM / SIGINT after its graceful shutdown, so a server stopped on purpose
        would exit with -15; this one exits 0 once its connections are closed and the engine loop is stopped."""

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, handler in old.items():
                    signal.signal(s, handler)

    return Server


def serve_main(args: argparse.Namespace) -> int:
    from .ray_serve import check_ray_args, ray_serve_main

    check_ray_args(args)
    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if args.max_queue is not None and args.max_queue < 0:
        raise ValueError(f"--max-queue must be >= 0, got {args.max_queue}")
    if args.ray is not None:   # the same app on replicas of a Ray cluster
        return ray_serve_main(args)
    import uvicorn

    from ..api import LLM
    from ..runtime.config_overrides import engine_config_with_recguide
    from .openai_app import ServeConfig, create_app, warm_up

    engine_config = engine_config_with_recguide(args.max_num_seqs, args.recguide)
    llm = LLM(model=args.model, backend=args.backend, device=args.device, dtype=args.dtype,
              compute_dtype=args.compute_dtype, kv_cache_dtype=args.kv_cache_dtype,
              max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
              prefix_cache=not args.no_prefix_cache, engine_config=engine_config)
    app = create_app(llm, ServeConfig(served_model_name=args.served_model_name, api_key=args.api_key,
                                      max_queue=args.max_queue), shutdown_llm=True)
    if not args.no_warmup:
        warm_up(llm)
    name = app.state.openai_server.model_name
    log.info("serving %s on http://%s:%d/v1 (max_num_seqs %d)", name, args.host, args.port, args.max_num_seqs)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            access_log=args.log_level in ("info", "debug"), timeout_graceful_shutdown=5)
    _quiet_exit_server()(config).run()
    log.info("stopped")
    return 0
