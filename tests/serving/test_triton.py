"""A real Triton Inference Server (the one bundled in nvidia-pytriton, on loopback) serving RecGuide.

Environment: Triton's python-backend stub needs ``numpy<2``. The server runs the Python named by
``RECGUIDE_TRITON_PYTHON`` (default: this interpreter); that environment needs the package,
``numpy<2`` and ``nvidia-pytriton`` (or a system ``tritonserver``). This process needs
``tritonclient[grpc]``. Without them the module is skipped, unless ``RECGUIDE_REQUIRE_TRITON=1``
(CI) turns the skip into a failure. Typical use::

    python -m venv /tmp/venv-triton
    /tmp/venv-triton/bin/pip install -e '.[triton]' pytest -c constraints.txt
    RECGUIDE_REQUIRE_TRITON=1 /tmp/venv-triton/bin/python -m pytest tests/serving -q
"""

from __future__ import annotations

import json
import os
import queue
import re
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import numpy as np
import pytest

from recguide_trt import LLM, EngineConfig, SamplingParams
from recguide_trt.runtime.cost_model import CostTable
from recguide_trt.serving import triton_repo
from tests.serving.conftest import PROMPTS, check_lossless, make_text_checkpoint

REQUIRE = os.environ.get("RECGUIDE_REQUIRE_TRITON", "") not in ("", "0")
MAX_TOKENS = 12
LIMIT = 1024
"""The server's max_tokens_limit; the cancellation test asks this many (seconds of decoding)."""
CLIENTS = 16
TIMEOUT = 120.0


def _unavailable(reason: str):
    if REQUIRE:
        pytest.fail(f"RECGUIDE_REQUIRE_TRITON is set but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


try:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException
except ImportError as exc:
    _unavailable(f"tritonclient[grpc] is not importable ({exc})")

SERVER_PYTHON = os.environ.get("RECGUIDE_TRITON_PYTHON", sys.executable)
SUITE_CACHE = os.environ.get("RECGUIDE_CACHE")
"""The suite's cache as the module found it: `reference` points RECGUIDE_CACHE elsewhere until the module ends."""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    problem = triton_repo.hosting_problem(SERVER_PYTHON)
    if problem:
        _unavailable(f"cannot run tritonserver: {problem} (set RECGUIDE_TRITON_PYTHON to an environment with "
                     f"numpy<2, nvidia-pytriton and recguide_trt)")
    root = tmp_path_factory.mktemp("triton")
    ckpt = make_text_checkpoint(root / "ckpt", max_position_embeddings=2048, no_eos=True)
    triton_repo.write_repository(root / "repo", model=str(ckpt), policy="recguide", max_tokens_limit=LIMIT,
                                 max_num_seqs=32, max_model_len=LIMIT + 64, torch_threads=1)
    env = dict(os.environ, RECGUIDE_CACHE=str(root / "cache"), OMP_NUM_THREADS="1")
    srv = triton_repo.TritonServer(root / "repo", python=SERVER_PYTHON, log_path=root / "tritonserver.log", env=env)
    srv.ckpt = ckpt
    srv.start()
    try:
        srv.wait_ready(timeout=180)
        yield srv
    finally:
        srv.stop()
        left = srv.leftover_pids()
        assert not left, f"processes of the server's group still alive: {left}"


@pytest.fixture(scope="module")
def reference(server, tmp_path_factory):
    old = os.environ.get("RECGUIDE_CACHE")
    os.environ["RECGUIDE_CACHE"] = str(tmp_path_factory.mktemp("cost-cache"))
    # A fixed step-cost table spares the reference a calibration (seconds on a loaded CPU); RecGuide's
    # block choices then differ from the server's, its greedy tokens must not.
    table = CostTable([1, CLIENTS], [1, 32], [[1e-3, 2e-3], [2e-3, 8e-3]])
    llm = LLM(model=str(server.ckpt), max_model_len=LIMIT + 64,
              engine_config=EngineConfig(max_num_seqs=CLIENTS, cost_table=table))
    yield llm
    llm.shutdown()
    if old is None:
        os.environ.pop("RECGUIDE_CACHE", None)
    else:
        os.environ["RECGUIDE_CACHE"] = old


# -- a small streaming client -------------------------------------------------------------------
@dataclass
class Result:
    chunks: list[str] = field(default_factory=list)
    final: dict | None = None
    error: str | None = None
    times: list[float] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.chunks)


def _inputs(text=None, max_tokens=None, **kw) -> list:
    spec = {"text_input": ("BYTES", np.object_), "max_tokens": ("INT32", np.int32), "temperature": ("FP32", np.float32),
            "top_p": ("FP32", np.float32), "seed": ("INT64", np.int64), "policy": ("BYTES", np.object_),
            "block_size": ("INT32", np.int32), "stream": ("BOOL", np.bool_)}
    values = dict(kw)
    if text is not None:
        values["text_input"] = text
    if max_tokens is not None:
        values["max_tokens"] = max_tokens
    out = []
    for name, value in values.items():
        if isinstance(value, tuple):  # (wire type, numpy array): deliberately malformed
            wire, arr = value
        else:
            wire, dt = spec[name]
            arr = np.array([value.encode() if isinstance(value, str) else value], dtype=dt)
        t = grpcclient.InferInput(name, list(arr.shape), wire)
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def stream_one(url: str, inputs: list, cancel_after_first: bool = False, timeout: float = TIMEOUT) -> Result:
    """One gRPC client with its own stream: send one request, collect until the final response."""
    res = Result()
    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        client.async_stream_infer("recguide", inputs, enable_empty_final_response=True)
        deadline = time.monotonic() + timeout
        while True:
            result, error = q.get(timeout=max(0.1, deadline - time.monotonic()))
            res.times.append(time.perf_counter())
            if error is not None:
                res.error = error.message() if isinstance(error, InferenceServerException) else str(error)
                return res
            text = result.as_numpy("text_output")
            if text is not None and text.size:
                res.chunks.append(text[0].decode())
            final = result.get_response().parameters["triton_final_response"].bool_param
            if cancel_after_first and res.chunks:
                client.stop_stream(cancel_requests=True)
                return res
            if final:
                res.final = {name: result.as_numpy(name) for name in
                             ("output_token_ids", "draft_tokens", "accepted_draft_tokens", "forwards", "mal", "tpf",
                              "finish_reason")}
                return res
    finally:
        client.stop_stream()
        client.close()


def run_concurrently(url: str, requests: list[list], **kw) -> list[Result]:
    results: list[Result | BaseException | None] = [None] * len(requests)
    start = threading.Barrier(len(requests))

    def work(i):
        try:
            start.wait(timeout=30)
            results[i] = stream_one(url, requests[i], **kw)
        except BaseException as exc:  # noqa: BLE001 - reported below
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT + 30)
    for r in results:
        if isinstance(r, BaseException) or r is None:
            raise AssertionError(f"a client failed: {r!r}")
    return results  # type: ignore[return-value]


# -- tests --------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["recguide", "linearspec"])
def test_concurrent_streams_match_generate(server, reference, policy):
    prompts = PROMPTS[:CLIENTS]
    requests = [_inputs(p, MAX_TOKENS, policy=policy, stream=True) for p in prompts]
    results = run_concurrently(server.grpc_url, requests)
    refs = reference.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, policy=policy))
    model, eos = reference.checkpoint.model, reference.config.eos_token_id
    drafted = 0
    for prompt, res, ref in zip(prompts, results, refs):
        assert res.error is None, res.error
        assert res.final is not None
        got = res.final["output_token_ids"].tolist()
        ids = reference.encode(prompt)
        if check_lossless(got, model, ids, MAX_TOKENS, eos, f"triton {policy} {prompt!r}"):
            assert check_lossless(ref.token_ids, model, ids, MAX_TOKENS, eos, f"generate {policy} {prompt!r}")
            assert got == ref.token_ids
            assert res.text == ref.text
        assert res.text == reference.decode(got)
        f = res.final
        assert f["finish_reason"][0].decode() in ("length", "eos")
        assert f["forwards"][0] >= 1
        if len(got) > 1:  # decoded past the prefill token
            assert f["mal"][0] >= 1.0 and f["tpf"][0] > 0
        assert 0 <= f["accepted_draft_tokens"][0] <= f["draft_tokens"][0]
        drafted += int(f["draft_tokens"][0])
        if policy == "linearspec" and got == ref.token_ids:
            assert f["draft_tokens"][0] == ref.metrics.drafted_tokens
            assert f["accepted_draft_tokens"][0] == ref.metrics.accepted_draft_tokens
    if policy == "linearspec":
        assert drafted > 0


def test_non_streaming_single_response(server, reference):
    res = stream_one(server.grpc_url, _inputs(PROMPTS[0], MAX_TOKENS, policy="ar"))
    assert res.error is None and res.final is not None
    assert len(res.times) == 1  # text and statistics in one final response
    got = res.final["output_token_ids"].tolist()
    assert res.text == reference.decode(got)
    assert res.final["mal"][0] == pytest.approx(1.0) and res.final["draft_tokens"][0] == 0


def test_http_generate_stream(server, reference):
    body = json.dumps({"text_input": PROMPTS[1], "max_tokens": MAX_TOKENS, "policy": "linearspec",
                       "stream": True}).encode()
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/recguide/generate_stream", data=body,
                                 headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
    assert events and all("error" not in e for e in events), events
    text = "".join(e.get("text_output", "") for e in events)
    ids = events[-1]["output_token_ids"]
    ids = ids if isinstance(ids, list) else [ids]
    assert text == reference.decode(ids)
    assert "mal" in events[-1] and "draft_tokens" in events[-1]


BAD_REQUESTS = [
    ("missing text_input", dict(max_tokens=4), "text_input is missing"),
    ("empty text", dict(text="", max_tokens=4), "text_input is empty"),
    ("missing max_tokens", dict(text="hi"), "max_tokens is missing"),
    ("max_tokens 0", dict(text="hi", max_tokens=0), "max_tokens must be a positive integer"),
    ("max_tokens above limit", dict(text="hi", max_tokens=LIMIT + 1), f"exceeds this server's limit of {LIMIT}"),
    ("wrong dtype", dict(text="hi", max_tokens=("FP32", np.array([4.0], np.float32))), "max_tokens"),
    ("unknown policy", dict(text="hi", max_tokens=4, policy="greedy"), "unknown policy 'greedy'"),
    ("bad block size", dict(text="hi", max_tokens=4, block_size=1), "block_size must be an integer >= 2"),
    ("bad top_p", dict(text="hi", max_tokens=4, top_p=1.5), "top_p must be in (0, 1]"),
]


@pytest.mark.parametrize("name, kw, message", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_request_gets_clear_error(server, name, kw, message):
    res = stream_one(server.grpc_url, _inputs(**kw))
    assert res.final is None and res.error is not None, f"{name}: expected an error, got {res}"
    assert message in res.error, f"{name}: {res.error!r}"
    if name == "wrong dtype":
        assert "INT32" in res.error and "FP32" in res.error, res.error
    ok = stream_one(server.grpc_url, _inputs(PROMPTS[2], 4, stream=True))
    assert ok.error is None and ok.final is not None and ok.final["output_token_ids"].size >= 1


def test_cancel_mid_stream_does_not_leak(server):
    n_cancel = 4
    long = [_inputs(PROMPTS[i], LIMIT, policy="ar", stream=True) for i in range(n_cancel)]
    cancelled = run_concurrently(server.grpc_url, long, cancel_after_first=True)
    assert all(r.final is None and r.chunks for r in cancelled)
    # the model saw the cancellations and ended the engine requests long before max_tokens
    pattern = re.compile(r"request \d+ cancelled after (\d+) tokens")
    deadline = time.monotonic() + 30
    while len(pattern.findall(server.log_tail(200_000))) < n_cancel and time.monotonic() < deadline:
        time.sleep(0.1)
    counts = [int(n) for n in pattern.findall(server.log_tail(200_000))]
    assert len(counts) == n_cancel, server.log_tail()
    assert all(n < LIMIT for n in counts), counts
    results = run_concurrently(server.grpc_url, [_inputs(p, MAX_TOKENS, stream=True) for p in PROMPTS[:CLIENTS]])
    assert all(r.error is None and r.final is not None for r in results)


def test_bench_sweep(server):
    from recguide_trt.serving.triton_bench import format_rows, run_triton_sweep

    rows = run_triton_sweep(server.grpc_url, PROMPTS[:4], [1, 4], max_tokens=8, policy="linearspec",
                            requests_per_level=6, timeout=60)
    assert [r["concurrency"] for r in rows] == [1, 4]
    for r in rows:
        assert r["requests"] == 6 and r["errors"] == 0, r["first_error"]
        assert r["output_tokens"] == 6 * 8  # no EOS in this checkpoint
        assert r["output_tok_s"] > 0 and r["ttft_mean"] > 0 and r["per_request_tok_s"] > 0
        assert r["mal_mean"] >= 1.0 and r["forwards"] > 0
    assert "agg tok/s" in format_rows(rows)


def test_server_stops_cleanly(server):
    t0 = time.monotonic()
    code = server.stop()
    assert code == 0, f"tritonserver exit code {code}:\n{server.log_tail()}"
    assert not server.leftover_pids()
    assert time.monotonic() - t0 < 30
    assert "successfully unloaded 'recguide'" in server.log_tail(200_000)


# -- the real model ---------------------------------------------------------------------------------
REAL_TOKENS = 24


def test_real_model_on_native_equals_llm_greedy(tmp_path, monkeypatch):
    """smollm2-135m in a repository written by name, served on the native backend: a chat answer and a code
    completion equal LLM's greedy ones token for token (about 30 s; after the tiny server has stopped)."""
    from recguide_trt.models import resolve_model
    from tests.runtime.helpers import flat_cost_table

    # The suite's cache, where the model and the native backend's build are already: under `reference`'s
    # temporary one, this test imported the model and compiled the extension again (~100 s, not ~30).
    if SUITE_CACHE is None:
        monkeypatch.delenv("RECGUIDE_CACHE", raising=False)
    else:
        monkeypatch.setenv("RECGUIDE_CACHE", SUITE_CACHE)
    problem = triton_repo.hosting_problem(SERVER_PYTHON)
    if problem:
        _unavailable(f"cannot run tritonserver: {problem}")
    llm = LLM("smollm2-135m", backend="native", engine_config=EngineConfig(
        max_num_seqs=2, max_model_len=1024, cost_table=flat_cost_table()))
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    prompts = [llm.chat_prompt(chat), "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"]
    refs = [llm.chat(chat, SamplingParams(max_tokens=REAL_TOKENS, policy="ar"))[0],
            llm.generate(prompts[1:], SamplingParams(max_tokens=REAL_TOKENS, policy="ar"))[0]]
    llm.shutdown()
    model_dir = triton_repo.write_repository(tmp_path / "repo", model="smollm2-135m", backend="native",
                                             policy="linearspec", max_tokens_limit=64, max_num_seqs=4,
                                             max_model_len=1024)
    pbtxt = (model_dir / "config.pbtxt").read_text()
    assert json.dumps(str(resolve_model("smollm2-135m").resolve())) in pbtxt  # the name, resolved at write time
    srv = triton_repo.TritonServer(tmp_path / "repo", python=SERVER_PYTHON, log_path=tmp_path / "tritonserver.log",
                                   env=dict(os.environ))
    srv.start()
    try:
        srv.wait_ready(timeout=300)
        for prompt, ref in zip(prompts, refs):
            res = stream_one(srv.grpc_url, _inputs(prompt, REAL_TOKENS, policy="linearspec"))
            assert res.error is None and res.final is not None, res.error
            got = res.final["output_token_ids"].tolist()
            assert got == ref.token_ids, f"{prompt!r}: triton {got} != LLM {ref.token_ids}"
            assert res.text == ref.text
            assert res.final["draft_tokens"][0] > 0  # linearspec really drafted
    finally:
        code = srv.stop()
    assert code == 0, srv.log_tail()
    assert not srv.leftover_pids()
    assert refs[0].text.strip() == "The capital of France is Paris."
