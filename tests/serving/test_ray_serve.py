"""``recguide serve --ray``: two engine replicas on a real two-node Ray cluster on loopback, the ``openai`` client.

The module starts a head and a worker node (1 CPU each, so each node runs one engine replica) in
their own sessions and a temp dir of their own (:mod:`tests.serving.ray_cluster`), deploys with
``recguide serve --ray ADDRESS --replicas 2``, and at the end stops the server and then the nodes
by the sessions it started, and checks that none of their processes is left. Without Ray the
module is skipped, unless ``RECGUIDE_REQUIRE_RAY=1`` (CI, ``scripts/run_tests.sh``) makes that a failure.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import httpx
import pytest

from tests.conftest import has_embedded
from tests.serving.openai_server import ServerProcess, metric, parse_metrics, recguide_command
from tests.serving.ray_cluster import CLUSTER_ENV

REQUIRE = os.environ.get("RECGUIDE_REQUIRE_RAY", "") not in ("", "0")
ENGINE_TITLE = "ray::ServeReplica:recguide:RecGuideEngine"
CLIENTS = 32
SLOTS = 16
"""Per replica (its max_ongoing_requests): 32 concurrent clients cannot all land on one replica."""
LONG_TOKENS = 1900
"""Tokens of a long stream (the server runs --max-model-len 2048): seconds of decoding on the stand-in."""
FAILOVER_BOUND_S = 60.0
"""A request on a killed replica must end (with an error) this soon after the kill, as the client sees it: on a
loaded machine the client first reads the chunks the replica sent before it died (0.2 s on a quiet machine,
28 s beside two CPU burners)."""


def _ray_missing() -> str | None:
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError as exc:
        return f"ray[serve] is not importable ({exc})"
    return None


def _skip_or_fail(reason: str):
    if REQUIRE:
        pytest.fail(f"RECGUIDE_REQUIRE_RAY is set but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def cluster():
    reason = _ray_missing()
    if reason:
        _skip_or_fail(reason)
    from tests.serving.ray_cluster import RayCluster

    c = RayCluster(cpus=(1, 1))
    yield c
    left = c.stop()
    assert not left, f"Ray processes left after the stop: {left}"


@pytest.fixture(scope="module")
def server(cluster):
    t0 = time.monotonic()
    srv = ServerProcess("--model", "tiny", "--ray", cluster.address, "--replicas", "2", "--max-num-seqs", str(SLOTS),
                        "--max-model-len", "2048", startup_s=240, env=CLUSTER_ENV)
    # /health answers once one replica is up; the tests need both (on a fresh machine the second may still
    # be loading, and the first would then take every stream).
    deadline = time.monotonic() + 240
    while len(_engine_replicas(srv.url)) < 2:
        assert time.monotonic() < deadline, f"the second replica never came up:\n{srv.output()[-3000:]}"
        time.sleep(0.5)
    srv.startup_s = time.monotonic() - t0
    yield srv
    rc = srv.stop(timeout=60)
    assert rc == 0, f"server exit code {rc}:\n{srv.output()[-3000:]}"
    assert "recguide: stopped" in srv.output()
    with pytest.raises(ProcessLookupError):
        os.killpg(srv.proc.pid, 0)


@pytest.fixture(scope="module")
def reference():
    from recguide_trt import LLM, SamplingParams
    from tests.serving.test_openai_server import MAX_TOKENS, POLICIES, PROMPTS

    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, policy=POLICIES[i % 3]) for i in range(CLIENTS)]
    return [(o.text, o.token_ids) for o in LLM("tiny").generate(PROMPTS[:CLIENTS], params)]


def _streams_match(server, reference) -> None:
    from tests.serving.test_openai_server import _check_against_reference, _stream_all

    _check_against_reference(_stream_all(server, CLIENTS), reference)


def _replica_counts(url: str) -> dict[str, float]:
    samples = parse_metrics(url)
    return {dict(lab)["replica"]: v for (name, lab), v in samples.items() if name == "recguide:replica_requests_total"}


def _running_per_replica(url: str) -> dict[str, float]:
    """Running requests of each replica that answered this /metrics scrape (every engine metric carries its
    replica)."""
    from recguide_trt.serving.endpoint_probe import running_per_replica

    return running_per_replica(httpx.get(url + "/metrics", timeout=10).text)


def _engine_replicas(url: str) -> set[str]:
    """The replicas that answered this /metrics scrape."""
    return set(_running_per_replica(url))


@pytest.mark.ray
@pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")
def test_32_streams_on_2_replicas_match_llm_generate(server, reference):
    before = _replica_counts(server.url)
    _streams_match(server, reference)
    after = _replica_counts(server.url)
    served = {r: after[r] - before.get(r, 0) for r in after}
    assert len([r for r, n in served.items() if n > 0]) == 2, served    # both replicas served requests
    assert sum(served.values()) == CLIENTS, served
    # Each replica's own engine metrics, labelled with it. They come from the replica's latest report
    # (every REPORT_PERIOD_S): on a fast machine all 32 streams can end between two reports, so the next
    # scrapes may still show the one before them.
    from recguide_trt.serving.ray_board import REPORT_PERIOD_S

    deadline = time.monotonic() + 10 * REPORT_PERIOD_S
    while True:
        samples = parse_metrics(server.url)
        done = {r: metric(samples, "vllm:request_success_total", replica=r) > 0 for r in served}
        if all(done.values()) or time.monotonic() > deadline:
            break
        time.sleep(REPORT_PERIOD_S / 5)
    assert metric(samples, "recguide:replicas_reporting") == 2
    assert all(done.values()), done
    print(f"\nray serve: up in {server.startup_s:.1f} s; requests per replica {served}")


@pytest.mark.ray
@pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")
def test_same_endpoints_and_errors_as_the_single_process_server(server):
    import openai

    from tests.serving.test_openai_server import BAD_REQUESTS

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    assert [m.id for m in client.models.list().data] == ["nld-tiny"]
    out = client.completions.create(model="nld-tiny", prompt=["def f():", "import os"], max_tokens=4, temperature=0,
                                    extra_body={"policy": "ar"})
    assert [c.index for c in out.choices] == [0, 1] and out.usage.completion_tokens >= 2
    # n choices and log-probabilities come through a replica as from the single-process server
    lp = client.completions.create(model="nld-tiny", prompt="def f():", max_tokens=4, temperature=0, n=2, logprobs=1,
                                   extra_body={"policy": "linearspec"})
    assert [c.index for c in lp.choices] == [0, 1] and lp.choices[0].text == lp.choices[1].text
    assert all(len(c.logprobs.token_logprobs) == 4 for c in lp.choices)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for body, param in BAD_REQUESTS[:8]:
            r = http.post("/v1/completions", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
        r = http.post("/v1/completions", content=b"not json")
        assert r.status_code == 400 and "body" in r.json()["error"]["message"]
        r = http.get("/v1/nowhere")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        assert http.get("/health").json() == {"status": "ok", "replicas": 2}
        assert r.headers.get("x-recguide-replica")   # which replica answered


@pytest.mark.ray
@pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")
def test_control_endpoints_answer_with_every_slot_busy(server):
    """Both replicas full (2 × SLOTS long requests): /health, /v1/models and /metrics answer before any request
    ends, and the scrape shows every slot running. A call to a replica through Ray Serve waits for a free slot:
    when the ingress routed these to the replicas, each waited for a request to end (scripts/probe_endpoints.py
    at e111309: /health 14 s, then a scrape showing nothing running)."""
    from recguide_trt.serving.endpoint_probe import probe_at_full_load

    result = asyncio.run(probe_at_full_load(server.url, 2 * SLOTS, "nld-tiny", max_tokens=LONG_TOKENS))
    health, models, scrape = result["probes"]
    assert [p["status"] for p in result["probes"]] == [200, 200, 200], result
    assert [p["requests_ended"] for p in result["probes"]] == [0, 0, 0], result
    assert sorted(scrape["running"].values()) == [SLOTS, SLOTS], scrape
    print("\nat full load: " + ", ".join(f"{p['path']} {p['seconds']:.2f} s" for p in result["probes"]))
    deadline = time.monotonic() + 60      # the client left: every replica frees its slots
    while sum(_running_per_replica(server.url).values()):
        assert time.monotonic() < deadline, _running_per_replica(server.url)
        time.sleep(0.2)


async def _long_stream(aclient, i: int) -> dict:
    """One long AR stream; ends with its token count or the error that ended it, and when."""
    t0 = time.monotonic()
    n, replica = 0, None
    try:
        raw = await aclient.completions.with_raw_response.create(
            model="nld-tiny", prompt=f"def f{i}(x):", max_tokens=LONG_TOKENS, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"policy": "ar", "ignore_eos": True})
        replica = raw.headers.get("x-recguide-replica")
        async for chunk in raw.parse():
            if chunk.usage is not None:
                n = chunk.usage.completion_tokens
        return {"ok": True, "tokens": n, "replica": replica, "end": time.monotonic(), "t0": t0}
    except Exception as exc:   # noqa: BLE001 - the test inspects what ended it
        return {"ok": False, "error": exc, "replica": replica, "end": time.monotonic(), "t0": t0}


@pytest.mark.ray
@pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")
def test_killed_replica_fails_its_requests_fast_and_ray_restarts_it(server, cluster, reference):
    import openai

    pids = cluster.find(ENGINE_TITLE)
    assert len(pids) == 2, pids
    old = _engine_replicas(server.url)
    assert len(old) == 2, old

    async def load():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                                      timeout=120) as aclient:
            # SLOTS + 1 streams: a replica takes at most SLOTS, so each of the two holds at least one and the
            # killed one has requests to fail (with SLOTS streams the router may put all on the other one).
            n = SLOTS + 1
            tasks = [asyncio.create_task(_long_stream(aclient, i)) for i in range(n)]
            # The kill comes while both replicas report running requests (/metrics, polled from the start),
            # not after the client sees every stream decoding: the stand-in decodes so fast that on a loaded
            # machine (a parallel suite) its replicas had finished while the client still read their chunks,
            # and the kill then failed nothing.
            deadline = time.monotonic() + 60
            while True:
                running = await asyncio.to_thread(_running_per_replica, server.url)
                if len(running) == 2 and min(running.values()) >= 1:
                    break
                assert time.monotonic() < deadline, f"both replicas never ran requests at once: {running}"
                await asyncio.sleep(0.05)   # a scrape at a time, not back to back: the replicas need the cores
            os.kill(pids[0], signal.SIGKILL)
            killed_at = time.monotonic()
            results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)   # never a hang
            # New requests right away: the survivor serves them.
            after = await asyncio.wait_for(asyncio.gather(*(aclient.completions.with_raw_response.create(
                model="nld-tiny", prompt="def g():", max_tokens=8, temperature=0, extra_body={"policy": "ar"})
                for _ in range(4))), timeout=60)
            return killed_at, results, after

    killed_at, results, after = asyncio.run(load())
    failed = [r for r in results if not r["ok"]]
    ok = [r for r in results if r["ok"]]
    assert failed, ("no stream on the killed replica failed; per stream (replica, ok, ended s after the kill): "
                    f"{sorted((r['replica'], r['ok'], round(r['end'] - killed_at, 2)) for r in results)}")
    for r in failed:
        assert isinstance(r["error"], openai.APIError), repr(r["error"])
        assert "replica" in str(r["error"]), r["error"]
        assert r["end"] - killed_at < FAILOVER_BOUND_S, r["end"] - killed_at
    dead = {r["replica"] for r in failed if r["replica"]}   # None: failed before its headers came
    assert len(dead) == 1, dead
    for r in ok:
        assert r["tokens"] == LONG_TOKENS and r["replica"] not in dead
    survivors = {a.headers["x-recguide-replica"] for a in after}
    assert survivors and not survivors & dead, (survivors, dead)
    assert all(a.parse().choices[0].finish_reason in ("stop", "length") for a in after)
    failures = parse_metrics(server.url)
    assert metric(failures, "recguide:replica_failures_total", replica=dead.pop()) == len(failed)
    worst = max(r["end"] - killed_at for r in failed)

    deadline = time.monotonic() + 240     # Ray Serve's controller replaces the dead replica (21-109 s seen here)
    while True:
        now = _engine_replicas(server.url)
        if len(now) == 2 and now - old:
            break
        assert time.monotonic() < deadline, f"no replacement replica: {now}"
        time.sleep(1)
    restarted = time.monotonic() - killed_at
    assert len(cluster.find(ENGINE_TITLE)) == 2
    _streams_match(server, reference)     # full concurrency on the restarted pair, still exact
    print(f"\nfailover: {len(failed)} streams on the killed replica ended with an error in at most {worst:.1f} s; "
          f"{len(ok)} on the other finished; replacement serving {restarted:.1f} s after the kill")


def test_ray_missing_is_a_clear_one_line_error(tmp_path):
    """Without the extra, `recguide serve --ray` names it instead of a traceback (ray made unimportable)."""
    fake = tmp_path / "ray"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('No module named ray (test stand-in)')\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    res = subprocess.run([*recguide_command(), "serve", "--ray", "auto", "--no-warmup"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert res.returncode == 2, res
    assert "Traceback" not in res.stderr and "recguide-trt[ray]" in res.stderr, res.stderr


def test_replica_options_need_ray():
    res = subprocess.run([*recguide_command(), "serve", "--replicas", "2"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "--replicas need --ray" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.skipif(_ray_missing() is not None, reason="ray[serve] is not importable")
def test_topology_validation():
    from recguide_trt.serving.ray_app import Topology

    assert Topology(replicas=2).autoscaling() is None
    assert Topology(replicas=2, max_replicas=4).autoscaling() == {"min_replicas": 1, "max_replicas": 4,
                                                                  "initial_replicas": 2}
    for bad in (Topology(replicas=0), Topology(replicas=5, max_replicas=4), Topology(min_replicas=3, max_replicas=2),
                Topology(target_ongoing_requests=0), Topology(max_queue=-1)):
        with pytest.raises(ValueError):
            bad.validate()


@pytest.mark.skipif(_ray_missing() is not None, reason="ray[serve] is not importable")
@pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")
def test_native_dtype_options_reach_the_replicas_llm(monkeypatch):
    """`recguide serve --ray --compute-dtype bfloat16 --kv-cache-dtype bfloat16`: the replica spec carries both
    and an engine replica builds its LLM with them (no cluster: Ray's replica context is stood in for);
    KubeRay's args take them too, and a backend other than native is refused before anything deploys."""
    import types

    import torch

    from recguide_trt.cli import build_parser
    from recguide_trt.serving import ray_app
    from recguide_trt.serving.ray_serve import replica_spec

    args = build_parser().parse_args(["serve", "--ray", "--model", "tiny", "--backend", "native", "--no-warmup",
                                      "--max-num-seqs", "2", "--compute-dtype", "bfloat16",
                                      "--kv-cache-dtype", "bfloat16", "--recguide", "switch_concurrency=0"])
    spec = replica_spec(args)
    assert (spec.compute_dtype, spec.kv_cache_dtype) == ("bfloat16", "bfloat16")
    assert spec.recguide == ("switch_concurrency=0",)
    spec.threads = torch.get_num_threads()
    monkeypatch.setattr(ray_app, "serve", types.SimpleNamespace(get_replica_context=lambda: types.SimpleNamespace(
        replica_id=types.SimpleNamespace(unique_id="r0", deployment_id=types.SimpleNamespace(app_name="test")))))
    monkeypatch.setattr(ray_app, "ray", types.SimpleNamespace(
        util=types.SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1"),
        get_runtime_context=lambda: types.SimpleNamespace(namespace="test")))
    engine = ray_app.RecGuideEngine(spec)   # its reporter finds no board (no cluster) and keeps trying
    try:
        assert (engine.llm.compute_dtype, engine.llm.kv_cache_dtype) == ("bfloat16", "bfloat16")
        assert (engine.llm.backend.compute_dtype, engine.llm.backend.kv_cache_dtype) == ("bfloat16", "bfloat16")
        assert engine.llm.engine.config.recguide.switch_concurrency == 0     # the override reached the replica
        assert engine.llm.engine.config.max_num_seqs == 2
        report = engine.report()
        assert report.replica == "r0" and report.alive and "vllm:num_requests_running" in report.metrics
    finally:
        engine.shutdown()
    assert not engine.reporter.running
    monkeypatch.undo()
    assert ray_app.build_from_args({"model": "tiny", "compute_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"})
    with pytest.raises(ValueError, match="kv_cache_dtype='bfloat16' is the native backend's option"):
        ray_app.build_app(ray_app.ReplicaSpec(backend="torch", kv_cache_dtype="bfloat16"), ray_app.Topology())
    with pytest.raises(ValueError, match="compute_dtype='fp8': choose one of"):
        ray_app.build_from_args({"compute_dtype": "fp8"})
    with pytest.raises(ValueError, match="--recguide: unknown field 'nosuch'"):
        ray_app.build_app(ray_app.ReplicaSpec(recguide=("nosuch=1",)), ray_app.Topology())


@pytest.mark.ray
def test_real_model_replica_answers_like_llm():
    """smollm2-135m on one engine replica of a 1-node loopback cluster of its own: a greedy chat answer over
    /v1/chat/completions equals LLM.chat's, token for token (about 40 s)."""
    reason = _ray_missing()
    if reason:
        _skip_or_fail(reason)
    from recguide_trt import LLM, EngineConfig, SamplingParams
    from tests.runtime.helpers import flat_cost_table
    from tests.serving.ray_cluster import RayCluster

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    llm = LLM("smollm2-135m", backend="native", engine_config=EngineConfig(
        max_num_seqs=2, max_model_len=1024, cost_table=flat_cost_table()))
    ref = llm.chat(messages, SamplingParams(max_tokens=24, policy="ar"))[0]
    llm.shutdown()
    cluster = RayCluster(cpus=(1,))
    try:
        # The model is in the suite's cache already (LLM above): the replica reads it from there.
        srv = ServerProcess("--model", "smollm2-135m", "--ray", cluster.address, "--replicas", "1",
                            "--max-num-seqs", "4", "--max-model-len", "1024", "--no-warmup", startup_s=300,
                            env=CLUSTER_ENV)
        try:
            with httpx.Client(base_url=srv.url, timeout=120) as http:
                assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["smollm2-135m"]
                r = http.post("/v1/chat/completions", json={
                    "model": "smollm2-135m", "messages": messages, "max_tokens": 24, "temperature": 0,
                    "policy": "linearspec", "return_token_ids": True})
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            assert choice["token_ids"] == ref.token_ids, (choice, ref.token_ids)
            assert choice["message"]["content"] == ref.text == "The capital of France is Paris."
            assert r.headers.get("x-recguide-replica")
        finally:
            rc = srv.stop(timeout=60)
        assert rc == 0, srv.output()[-3000:]
    finally:
        left = cluster.stop()
    assert not left, f"Ray processes left after the stop: {left}"
