"""``recguide serve`` with an API key, a queue limit and a chat template (a real server on 127.0.0.1).

The checkpoint is a copy of the embedded model with a ``tokenizer_config.json`` that adds a chat
template (the embedded model has none). One slot and ``--max-queue 1``: a second request waits, a
third is refused with 503. Only AR / LinearSpec requests here, so no step-cost table is measured.
"""

from __future__ import annotations

import json
import shutil
import time

import httpx
import pytest

from tests.conftest import EMBEDDED, has_embedded
from tests.serving.openai_server import ServerProcess, metric, parse_metrics

pytestmark = pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")
openai = pytest.importorskip("openai")

KEY = "test-key-123"
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}# {{ m['content'] }}\n"
            "{% else %}{{ m['role'] }}: {{ m['content'] }}\n{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="module")
def chat_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "nld-tiny-chat"
    shutil.copytree(EMBEDDED, path)
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, "bos_token": "",
                                                            "eos_token": "<eos>"}))
    return path


@pytest.fixture(scope="module")
def server(chat_ckpt):
    # The eager torch backend and the model's whole context: the queue test's first request must still run
    # when its third arrives and when its streams are closed (2000 tokens: ~28 s on torch, ~1 s on native).
    srv = ServerProcess("--model", str(chat_ckpt), "--max-num-seqs", "1", "--max-queue", "1", "--api-key", KEY,
                        "--served-model-name", "tiny-chat", "--no-warmup", "--backend", "torch",
                        "--max-model-len", "2048")
    yield srv
    assert srv.stop() == 0, srv.output()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def test_without_the_key_401(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/v1/models").status_code == 401
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="tiny-chat", prompt="x", max_tokens=1)
    assert httpx.get(server.url + "/health").status_code == 200   # probes need no key


def test_chat_uses_the_template_and_matches_completions(client):
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]
    rendered = "# You write Python.\nuser: def add(a, b):\nassistant:"
    chat = client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=12, temperature=0,
                                          extra_body={"policy": "linearspec"})
    done = client.completions.create(model="tiny-chat", prompt=rendered, max_tokens=12, temperature=0,
                                     extra_body={"policy": "ar"})
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == done.choices[0].text
    assert chat.usage.prompt_tokens == done.usage.prompt_tokens
    stream = client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == done.choices[0].text
    assert chunks[-1].usage.completion_tokens == done.usage.completion_tokens
    assert "speculative_decoding" in chunks[-1].model_extra["metrics"]


def test_chat_logprobs_stream_and_whole_agree(client):
    messages = [{"role": "user", "content": "def add(a, b):"}]
    args = dict(model="tiny-chat", messages=messages, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2,
                extra_body={"policy": "linearspec"})
    whole = client.chat.completions.create(**args)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    assert "".join(t.token for t in content) == whole.choices[0].message.content
    for t in content:
        assert bytes(t.bytes) == t.token.encode()
        assert len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob  # greedy
    streamed = [t for c in client.chat.completions.create(stream=True, **args) if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    # this server runs the torch backend, whose float sums depend on the batch (and on the prefix cache's hit)
    assert [t.token for t in streamed] == [t.token for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-4)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=2, top_logprobs=2)
    assert info.value.body["param"] == "top_logprobs"


def test_bad_messages_are_400(client):
    for messages, param in [([], "messages"), ([{"role": "wizard", "content": "x"}], "messages[0].role"),
                            ([{"role": "user", "content": 5}], "messages[0].content")]:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=2)
        assert info.value.body["param"] == param


def _occupancy(samples: dict) -> tuple[float, float]:
    """(running, waiting) of a /metrics scrape."""
    return metric(samples, "vllm:num_requests_running"), metric(samples, "vllm:num_requests_waiting")


def _drained(server, deadline_s: float = 20) -> dict:
    """/metrics once no request is running or waiting (closed streams' requests are cancelled)."""
    deadline = time.monotonic() + deadline_s
    while True:
        samples = parse_metrics(server.url)
        if sum(_occupancy(samples)) == 0:
            return samples
        assert time.monotonic() < deadline, "the closed streams' requests still hold the queue"
        time.sleep(0.1)


def test_queue_full_is_503_with_retry_after(server, client):
    long = {"model": "tiny-chat", "prompt": "def f(x):", "max_tokens": 2000, "temperature": 0, "policy": "ar",
            "ignore_eos": True, "stream": True}
    auth = {"Authorization": f"Bearer {KEY}"}
    aborted = metric(parse_metrics(server.url), "vllm:request_success_total", finished_reason="abort")
    with httpx.Client(base_url=server.url, headers=auth, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=long) as running:
            # Keep the line iterator: a dropped one is closed by the garbage collector, and httpcore then
            # closes the connection (the server cancels the request: the slot would be free again).
            lines = running.iter_lines()
            next(lines)                                        # running now: the only slot is taken
            with http.stream("POST", "/v1/completions", json=long) as waiting:
                assert waiting.status_code == 200              # queued: one may wait
                occ = _occupancy(parse_metrics(server.url))
                refused = http.post("/v1/completions", json=dict(long, stream=False, max_tokens=1))
    assert occ == (1, 1), occ
    assert refused.status_code == 503, (refused.text[:300], server.output()[-3000:])
    assert refused.headers["Retry-After"] == "1" and refused.json()["error"]["code"] == "queue_full"
    # Both streams were closed unfinished (2000 tokens take ~28 s here): both requests were cancelled.
    samples = _drained(server)
    assert metric(samples, "vllm:request_success_total", finished_reason="abort") == aborted + 2
    out = client.completions.create(model="tiny-chat", prompt="x", max_tokens=2, temperature=0,
                                    extra_body={"policy": "ar"}, timeout=30)
    assert out.usage.completion_tokens >= 1
