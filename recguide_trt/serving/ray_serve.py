"""``recguide serve --ray [ADDRESS|auto]``: deploy the OpenAI app as a Ray Serve application and keep it up.

This process is a Ray driver: it connects to a cluster (``auto``: the one ``ray start`` made on this
node; an address ``HOST:PORT``; bare ``--ray``: that or a new local one), starts Ray Serve's HTTP
proxy on ``--host``/``--port``, deploys :func:`.ray_app.build_app` and waits for SIGTERM / Ctrl-C.
Then it deletes its application, and stops Serve when no other application is left on the cluster
(the cluster itself keeps running unless this process started it). Ray is imported only here, so
the rest of ``recguide`` works without the ``ray`` extra.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

log = logging.getLogger("recguide_trt.serve")

INSTALL_HINT = "pip install 'recguide-trt[ray]' (or: pip install 'ray[serve]>=2.60')"
RAY_ONLY = ("replicas", "replica_cpus", "replica_gpus", "min_replicas", "max_replicas", "target_ongoing_requests")


def add_ray_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("replicas on a Ray cluster (Ray Serve; needs the 'ray' extra)")
    g.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS|auto",
                   help="serve as a Ray Serve application: 'auto' joins the cluster started with `ray start` "
                        "on this node, HOST:PORT joins that one; bare --ray also starts a local one if none runs")
    g.add_argument("--replicas", type=int, default=None, help="engine replicas, each its own engine (default 1)")
    g.add_argument("--replica-cpus", type=float, default=None,
                   help="CPUs Ray reserves per replica; also its torch threads (default 1)")
    g.add_argument("--replica-gpus", type=float, default=None, help="GPUs per replica (default 0; 1 with --device cuda)")
    g.add_argument("--min-replicas", type=int, default=None, help="autoscaling: fewest replicas")
    g.add_argument("--max-replicas", type=int, default=None, help="autoscaling: most replicas")
    g.add_argument("--target-ongoing-requests", type=float, default=None,
                   help="autoscaling: requests per replica Ray Serve aims at (default: Ray's, 2)")
    g.add_argument("--proxy-location", default="HeadOnly", choices=["HeadOnly", "EveryNode"],
                   help="where Ray Serve runs its HTTP proxy (EveryNode: one per node, behind your load balancer)")


def check_ray_args(args: argparse.Namespace) -> None:
    """The replica options mean nothing without --ray: say so rather than ignore them."""
    if getattr(args, "ray", None) is None:
        given = [f"--{name.replace('_', '-')}" for name in RAY_ONLY if getattr(args, name, None) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} need --ray (replicas run on a Ray cluster)")


def replica_spec(args: argparse.Namespace):
    """The :class:`.ray_app.ReplicaSpec` of ``recguide serve`` arguments: what every engine replica builds."""
    from .ray_app import ReplicaSpec

    return ReplicaSpec(model=args.model, backend=args.backend, device=args.device, dtype=args.dtype,
                       compute_dtype=args.compute_dtype, kv_cache_dtype=args.kv_cache_dtype,
                       max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                       prefix_cache=not args.no_prefix_cache, served_model_name=args.served_model_name, api_key=args.api_key, warmup=not args.no_warmup,
                       recguide=tuple(getattr(args, "recguide", None) or ()))


def ray_serve_main(args: argparse.Namespace) -> int:
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        print(f"error: recguide serve --ray needs Ray Serve, which is not importable here ({exc}): {INSTALL_HINT}",
              file=sys.stderr)
        return 2
    from .ray_app import APP_NAME, Topology, build_app, fill_replica_defaults

    spec = replica_spec(args)
    topology = Topology(replicas=args.replicas or 1, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                        target_ongoing_requests=args.target_ongoing_requests, max_queue=args.max_queue)
    if args.replica_cpus is not None:
        topology.replica_cpus = args.replica_cpus
    if args.replica_gpus is not None:
        topology.replica_gpus = args.replica_gpus
    fill_replica_defaults(spec, topology, gpus_given=args.replica_gpus is not None)
    app = build_app(spec, topology)   # validates before anything connects

    ray.init(address=args.ray or None, log_to_driver=args.log_level in ("info", "debug"))
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    try:
        serve.start(proxy_location=args.proxy_location, http_options={"host": args.host, "port": args.port})
        serve.run(app, name=APP_NAME, route_prefix="/")
        res = ray.cluster_resources()
        log.info("serving on http://%s:%d/v1 through Ray Serve: %d engine replica(s), cluster of %d node(s), "
                 "%g CPUs, %g GPUs", args.host, args.port, topology.replicas, len(ray.nodes()), res.get("CPU", 0),
                 res.get("GPU", 0))
        stop.wait()
    finally:
        log.info("stopping the Ray Serve application")
        try:
            serve.delete(APP_NAME)
            if not serve.status().applications:
                serve.shutdown()
        except Exception as exc:  # the cluster may be gone already; the process still exits
            log.warning("could not stop Ray Serve cleanly: %s", exc)
        ray.shutdown()   # disconnects; stops the cluster only if ray.init started it
    log.info("stopped")
    return 0
