"""``recguide serve --ray``: the OpenAI app of ``recguide serve`` as a Ray Serve application.

Two deployments (docs/replicas.md says why):

* ``RecGuideEngine``, N replicas: each builds its own :class:`~recguide_trt.api.LLM` (its own engine
  and background loop) and the single-process server's app (``openai_app.create_app``), and runs
  every request it is given through that app (:mod:`.asgi_bridge`), streaming the app's messages
  back. One code path: endpoints, fields, validation and errors are the single-process server's.
* ``RecGuideIngress``, one replica behind Ray's HTTP proxy: forwards each request to an engine
  replica through a ``DeploymentHandle`` (Ray Serve's router: the less loaded of two replicas by
  queue length) and relays the answer, streaming as it comes. It turns a replica that dies or cannot
  be reached into OpenAI's error shape — a 503 before the response started, an error event in the
  stream after — and answers ``/health``, ``/metrics`` and ``/v1/models`` itself, from the reports the
  replicas push (:mod:`.ray_board`, :mod:`.ray_metrics`): a call to a replica through Serve would wait
  for a free slot, which under full load is the end of a generation.

A replica takes at most ``max_num_seqs`` requests at once (``max_ongoing_requests``): what waits
for a slot waits in Ray's router, which hands it to whichever replica frees one first;
``--max-queue`` bounds that queue (Ray's ``max_queued_requests``, a 503 with Retry-After beyond it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import ray
from ray import serve
from ray.exceptions import RayError, TaskCancelledError
from ray.serve.exceptions import BackPressureError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..backends.choice import check_native_dtypes, check_native_dtypes_backend
from .asgi_bridge import portable_scope, run_asgi
from .openai_app import check_api_key
from .openai_protocol import APIError, error_body
from .ray_board import REPORT_PERIOD_S, Report, Reporter, create_board
from .ray_metrics import RoutingMetrics

log = logging.getLogger(__name__)

APP_NAME = "recguide"
REPLICA_HEADER = "x-recguide-replica"
"""Response header naming the engine replica that answered (also the ``replica`` label of /metrics)."""
BOARD_TIMEOUT_S = 5.0
"""How long ``/health`` and ``/metrics`` wait for the replicas' board (a local actor call, milliseconds)."""


@dataclass
class ReplicaSpec:
    """What every engine replica builds: ``recguide serve``'s model and server settings (picklable)."""

    model: str | None = None
    backend: str | None = None
    device: str = "cpu"
    dtype: str | None = None
    compute_dtype: str | None = None
    """The native backend's arithmetic (``LLM(compute_dtype=...)``; None: float32)."""
    kv_cache_dtype: str | None = None
    """The native backend's KV-cache storage (``LLM(kv_cache_dtype=...)``; None: float32)."""
    max_num_seqs: int = 64
    max_model_len: int | None = None
    prefix_cache: bool = True
    """The engine's prefix cache (``recguide serve --no-prefix-cache`` turns it off)."""
    served_model_name: str | None = None
    api_key: str | None = None
    threads: int | None = None
    """``torch.set_num_threads`` in the replica (default: the CPUs Ray gives it, at least 1)."""
    warmup: bool = True
    recguide: tuple[str, ...] = ()
    """``FIELD=VALUE`` overrides of the RecGuide policy's config (``recguide serve --recguide``)."""

    def llm_kwargs(self) -> dict:
        """The keyword arguments of the replica's :class:`~recguide_trt.api.LLM`."""
        from ..runtime.config_overrides import engine_config_with_recguide

        engine_config = engine_config_with_recguide(self.max_num_seqs, list(self.recguide))
        return dict(model=self.model, backend=self.backend, device=self.device, dtype=self.dtype,
                    compute_dtype=self.compute_dtype, kv_cache_dtype=self.kv_cache_dtype,
                    max_num_seqs=self.max_num_seqs, max_model_len=self.max_model_len,
                    prefix_cache=self.prefix_cache, engine_config=engine_config)

    def validate(self) -> None:
        """What the replicas' LLM would reject about the native dtype options and the RecGuide overrides, said
        before any deploys."""
        from ..runtime.config_overrides import recguide_config

        recguide_config(list(self.recguide))
        check_native_dtypes(self.compute_dtype, self.kv_cache_dtype)
        if self.backend is not None:
            check_native_dtypes_backend(self.backend, self.compute_dtype, self.kv_cache_dtype)


@dataclass
class Topology:
    """How many engine replicas, what each one reserves, and how they scale."""

    replicas: int = 1
    replica_cpus: float = 1.0
    replica_gpus: float = 0.0
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float | None = None
    max_queue: int | None = None
    extra_actor_options: dict = field(default_factory=dict)

    def autoscaling(self) -> dict | None:
        """Ray Serve's ``autoscaling_config`` when any bound is given (``replicas`` is the initial count)."""
        if self.min_replicas is None and self.max_replicas is None and self.target_ongoing_requests is None:
            return None
        lo = self.min_replicas if self.min_replicas is not None else 1
        hi = self.max_replicas if self.max_replicas is not None else max(lo, self.replicas)
        if not 0 <= lo <= hi or hi < 1:
            raise ValueError(f"need 0 <= --min-replicas <= --max-replicas and --max-replicas >= 1, got {lo}, {hi}")
        if not lo <= self.replicas <= hi:
            raise ValueError(f"--replicas {self.replicas} is outside [--min-replicas {lo}, --max-replicas {hi}]")
        cfg = {"min_replicas": lo, "max_replicas": hi, "initial_replicas": self.replicas}
        if self.target_ongoing_requests is not None:
            if self.target_ongoing_requests <= 0:
                raise ValueError(f"--target-ongoing-requests must be > 0, got {self.target_ongoing_requests}")
            cfg["target_ongoing_requests"] = self.target_ongoing_requests
        return cfg

    def validate(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {self.replicas}")
        if self.replica_cpus < 0 or self.replica_gpus < 0:
            raise ValueError("--replica-cpus and --replica-gpus must be >= 0")
        if self.max_queue is not None and self.max_queue < 0:
            raise ValueError(f"--max-queue must be >= 0, got {self.max_queue}")
        self.autoscaling()


class RecGuideEngine:
    """One engine replica: its own LLM and engine loop behind the single-process server's app."""

    def __init__(self, spec: ReplicaSpec):
        import torch

        from ..api import LLM
        from .openai_app import ServeConfig, create_app, warm_up

        threads = spec.threads or max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))
        torch.set_num_threads(threads)
        self.llm = LLM(**spec.llm_kwargs())
        self.app = create_app(self.llm, ServeConfig(served_model_name=spec.served_model_name, api_key=spec.api_key))
        self.server = self.app.state.openai_server
        if spec.warmup:
            warm_up(self.llm)
        replica_id = serve.get_replica_context().replica_id
        self.replica = replica_id.unique_id
        self.reporter = Reporter(replica_id.deployment_id.app_name, ray.get_runtime_context().namespace,
                                 self.report)
        log.warning("recguide replica %s ready: pid %d, node %s, %s backend, %d threads, %d slots", self.replica,
                    os.getpid(), ray.util.get_node_ip_address(), self.llm.backend_name, threads, spec.max_num_seqs)

    async def handle(self, scope: dict, body: bytes) -> AsyncIterator[list[dict]]:
        """One HTTP request through the app: batches of its ASGI messages, the replica named in the headers."""
        tag = (REPLICA_HEADER.encode(), self.replica.encode())
        async for batch in run_asgi(self.app, scope, body):
            if batch[0]["type"] == "http.response.start":
                batch[0] = dict(batch[0], headers=[*batch[0].get("headers", []), tag])
            yield batch

    def report(self) -> Report:
        """What the ingress's /health, /metrics and /v1/models need of this replica (pushed by :attr:`reporter`)."""
        return Report(self.replica, self.server.loop.alive, self.server.metrics.render().decode(),
                      self.server.model_list())

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose engine loop died is replaced."""
        if not self.server.loop.alive:
            raise RuntimeError(f"replica {self.replica}: the engine loop is not running")

    def shutdown(self) -> None:
        reporter = getattr(self, "reporter", None)
        if reporter is not None:
            reporter.stop()
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.shutdown()

    def __del__(self):
        self.shutdown()


def _error(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _no_replica(why: str = "") -> JSONResponse:
    """The 503 of an endpoint the ingress answers from the replicas' reports when no replica serves."""
    return _error(APIError(f"no engine replica is serving{why}", status=503, type="server_error",
                           code="replica_unavailable", headers={"Retry-After": "1"}))


def _sse_error(message: str, code: str) -> bytes:
    return f"data: {json.dumps(error_body(message, 'server_error', None, code))}\n\ndata: [DONE]\n\n".encode()


def _header(start: dict, name: str) -> str:
    key = name.encode()
    return next((v.decode("latin-1") for k, v in start.get("headers", []) if k.lower() == key), "")


class _Relayed(Response):
    """The engine replica's response, replayed message by message (a stream stays a stream)."""

    def __init__(self, start: dict, messages: AsyncIterator[dict]):
        self.status_code = start["status"]
        self.start = start
        self.messages = messages
        self.background = None

    async def __call__(self, scope, receive, send) -> None:
        try:
            await send(self.start)
            async for message in self.messages:
                await send(message)
        finally:  # the client left mid-stream: closing the chain cancels the replica's request
            await self.messages.aclose()


class RecGuideIngress:
    """The HTTP entry: routes each request to an engine replica and relays the answer."""

    def __init__(self, engine, api_key: str | None = None):
        self.engine = engine
        self.api_key = api_key
        self.stream = engine.options(stream=True)
        self.routing = RoutingMetrics()
        self._board_at = (serve.get_replica_context().replica_id.deployment_id.app_name,
                          ray.get_runtime_context().namespace)
        self.board = create_board(*self._board_at)

    async def __call__(self, request: Request) -> Response:
        if request.method == "GET" and request.url.path in ("/health", "/metrics", "/v1/models"):
            reports, stale = await self._reports()
            if request.url.path == "/health":
                return self._health(reports, stale)
            if request.url.path == "/metrics":
                return self._metrics(reports, stale)
            return self._models(request, reports)
        body = await request.body()
        gen = self.stream.handle.remote(portable_scope(request.scope), body)
        messages = self._messages(gen)
        try:
            start = await anext(messages)
        except BackPressureError:
            return _error(APIError("every replica is at capacity and --max-queue requests wait: retry later",
                                   status=503, type="server_error", code="queue_full",
                                   headers={"Retry-After": "1"}))
        except _ReplicaFailed as exc:
            self.routing.failures.labels("").inc()
            return _error(APIError(str(exc), status=503, type="server_error", code="replica_unavailable",
                                   headers={"Retry-After": "1"}))
        replica = _header(start, REPLICA_HEADER)
        self.routing.requests.labels(replica).inc()
        if _header(start, "content-type").startswith("text/event-stream"):
            return _Relayed(start, self._relay_stream(messages, replica))
        parts = []
        try:
            async for m in messages:
                parts.append(m)
        except _ReplicaFailed as exc:
            self.routing.failures.labels(replica).inc()
            return _error(APIError(f"{exc} before the response was complete", status=503, type="server_error",
                                   code="replica_failed"))
        return _Relayed(start, _aiter(parts))

    async def _messages(self, gen) -> AsyncIterator[dict]:
        """The replica's messages (the body pieces of one batch joined: one send for what arrived together);
        a Ray failure becomes :class:`_ReplicaFailed`; closing the generator cancels the replica's request."""
        complete = False
        try:
            async for batch in gen:
                for m in _coalesce(batch):
                    complete = m["type"] == "http.response.body" and not m.get("more_body", False)
                    yield m
            if not complete:
                raise _ReplicaFailed("the replica ended the response early (its log has the error)")
        except (BackPressureError, TaskCancelledError):
            raise
        except RayError as exc:
            raise _ReplicaFailed(f"the engine replica serving this request failed ({type(exc).__name__})") from exc
        finally:
            if not complete:
                gen.cancel()   # the client left (or the replica failed): the replica frees the request

    async def _relay_stream(self, messages: AsyncIterator[dict], replica: str) -> AsyncIterator[dict]:
        try:
            async for m in messages:
                yield m
        except _ReplicaFailed as exc:
            self.routing.failures.labels(replica).inc()
            log.warning("replica %s failed mid-stream: %s", replica, exc.__cause__ or exc)
            yield {"type": "http.response.body", "body": _sse_error(f"{exc} (replica {replica}): the stream "
                                                                    f"is incomplete; retry the request",
                                                                    "replica_failed"),
                   "more_body": False}
        finally:
            await messages.aclose()

    async def _reports(self) -> tuple[list[Report], int]:
        """The replicas' latest reports and how many went stale. A board that cannot be read (it died with the
        ingress it was made by, say an earlier one of a redeploy) is made again, and read again once the
        replicas have had time to find it, so that /health does not answer 503 for a cluster that serves."""
        for attempt in range(2):
            try:
                return await asyncio.wait_for(self.board.read.remote(), BOARD_TIMEOUT_S)
            except TimeoutError:   # alive but slow: a new handle would find the same board
                log.warning("the replicas' board did not answer in %g s", BOARD_TIMEOUT_S)
                break
            except RayError as exc:
                log.warning("the replicas' board could not be read (%s): made again", type(exc).__name__)
                self.board = create_board(*self._board_at)
                if attempt == 0:
                    await asyncio.sleep(3 * REPORT_PERIOD_S)
        return [], 0

    @staticmethod
    def _health(reports: list[Report], stale: int) -> Response:
        """200 while any replica's engine loop runs (the single-process server's answer, and how many do)."""
        up = sum(r.alive for r in reports)
        if up:
            return JSONResponse({"status": "ok", "replicas": up})
        why = (f"{len(reports)} report a stopped engine loop, {stale} stopped reporting" if reports or stale
               else "none has reported yet")
        return _no_replica(f": {why}")

    def _models(self, request: Request, reports: list[Report]) -> Response:
        """The replicas' model list (every replica serves the same model), behind the same API key check."""
        try:
            check_api_key(self.api_key, request)
        except APIError as exc:
            return _error(exc)
        if not reports:
            return _no_replica()
        return JSONResponse(reports[0].models, headers={REPLICA_HEADER: reports[0].replica})

    def _metrics(self, reports: list[Report], stale: int) -> Response:
        from .openai_metrics import CONTENT_TYPE

        body = self.routing.render([(r.replica, r.metrics) for r in reports], unreachable=stale)
        return Response(body, media_type=CONTENT_TYPE)


def _coalesce(batch: list[dict]) -> list[dict]:
    """Consecutive ``http.response.body`` messages of a batch as one (under load a batch holds several SSE events)."""
    out: list[dict] = []
    for m in batch:
        if out and m["type"] == out[-1]["type"] == "http.response.body" and out[-1].get("more_body", False):
            out[-1] = {"type": m["type"], "body": out[-1]["body"] + m.get("body", b""),
                       "more_body": m.get("more_body", False)}
        else:
            out.append(m)
    return out


class _ReplicaFailed(Exception):
    """The engine replica died, could not be reached, or ended a response early."""


async def _aiter(items: list) -> AsyncIterator:
    for x in items:
        yield x


def build_app(spec: ReplicaSpec, topology: Topology):
    """The Ray Serve application: the ingress bound to ``topology.replicas`` engine replicas."""
    topology.validate()
    spec.validate()
    actor = {"num_cpus": topology.replica_cpus, **topology.extra_actor_options}
    if topology.replica_gpus:
        actor["num_gpus"] = topology.replica_gpus
    engine_opts = {"name": "RecGuideEngine", "ray_actor_options": actor, "max_ongoing_requests": spec.max_num_seqs,
                   "max_queued_requests": -1 if topology.max_queue is None else topology.max_queue,
                   "health_check_period_s": 5, "graceful_shutdown_timeout_s": 5}
    auto = topology.autoscaling()
    if auto is None:
        engine_opts["num_replicas"] = topology.replicas
    else:
        engine_opts["autoscaling_config"] = auto
    engine = serve.deployment(RecGuideEngine, **engine_opts)
    ingress = serve.deployment(RecGuideIngress, name="RecGuideIngress", num_replicas=1,
                               ray_actor_options={"num_cpus": 0}, max_ongoing_requests=100_000)
    return ingress.bind(engine.bind(spec), spec.api_key)


def _coerce(value, annotation: str):
    """A ``serve run ... key=value`` argument arrives as text: convert it to the field's type."""
    if not isinstance(value, str) or value == "" or annotation.startswith("str"):
        return value
    if value.lower() in ("none", "null") and "None" in annotation:
        return None
    if annotation == "bool":
        return value.lower() in ("1", "true", "yes", "on")
    for kind in (int, float):
        if annotation.startswith(kind.__name__):
            return kind(value)
    return value


def build_from_args(args: dict):
    """Ray Serve's application builder: ``import_path: recguide_trt.serving.ray_app:build_from_args``.

    What KubeRay's ``serveConfigV2`` (``deploy/kuberay/rayservice.yaml``) and ``serve run`` use; ``args``
    holds :class:`ReplicaSpec` and :class:`Topology` fields by name (``replica_gpus`` defaults to 1
    on CUDA, ``threads`` to ``replica_cpus``). An unknown key is an error, not ignored.
    """
    from dataclasses import fields

    spec_f = {f.name: f for f in fields(ReplicaSpec)}
    topo_f = {f.name: f for f in fields(Topology) if f.name != "extra_actor_options"}
    unknown = sorted(set(args) - set(spec_f) - set(topo_f))
    if unknown:
        raise ValueError(f"unknown recguide application args {unknown}; known: {sorted({*spec_f, *topo_f})}")
    spec = ReplicaSpec(**{k: _coerce(v, spec_f[k].type) for k, v in args.items() if k in spec_f})
    topology = Topology(**{k: _coerce(v, topo_f[k].type) for k, v in args.items() if k in topo_f})
    fill_replica_defaults(spec, topology, gpus_given="replica_gpus" in args)
    return build_app(spec, topology)


def fill_replica_defaults(spec: ReplicaSpec, topology: Topology, gpus_given: bool) -> None:
    """What ``recguide serve --ray`` and KubeRay's builder leave unset: one GPU per replica on CUDA,
    as many torch threads as the replica reserves CPUs."""
    if not gpus_given and spec.device.startswith("cuda"):
        topology.replica_gpus = 1.0
    if spec.threads is None:
        spec.threads = max(1, int(topology.replica_cpus))
