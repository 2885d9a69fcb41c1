"""``recguide serve`` as clients use it: a real server on 127.0.0.1, the official ``openai`` client.

One server (the embedded tiny model, 64 slots) serves the whole module; it is stopped in the
fixture's finaliser and must exit cleanly.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from tests.conftest import has_embedded
from tests.serving.openai_server import ServerProcess, metric, parse_metrics

pytestmark = pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")
openai = pytest.importorskip("openai")

POLICIES = ("ar", "linearspec", "recguide")
PROMPTS = [f"def function_{i}(x{i % 3}):\n    " if i % 2 else f"import os\nclass Widget{i}:\n    "
           for i in range(64)]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--model", "tiny", "--max-num-seqs", "64")
    yield srv
    rc = srv.stop()
    assert rc == 0, f"server exit code {rc}:\n{srv.output()[-3000:]}"
    assert "recguide: stopped" in srv.output()      # a graceful shutdown, not a kill
    with pytest.raises(ProcessLookupError):        # nothing of its process group is left
        os.killpg(srv.proc.pid, 0)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference():
    """LLM.generate's greedy outputs for every (prompt, policy) the concurrency test sends."""
    from recguide_trt import LLM, SamplingParams

    llm = LLM("tiny")
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, policy=POLICIES[i % 3])
              for i in range(len(PROMPTS))]
    outs = llm.generate(PROMPTS, params)
    return [(o.text, o.token_ids) for o in outs]


def _stream_all(server, n: int = len(PROMPTS)) -> list[dict]:
    """n concurrent streaming completions (policy by index), each collected from its chunks."""
    async def one(aclient, i: int) -> dict:
        stream = await aclient.completions.create(
            model="nld-tiny", prompt=PROMPTS[i], max_tokens=MAX_TOKENS, temperature=0, stream=True,
            stream_options={"include_usage": True},
            extra_body={"policy": POLICIES[i % 3], "return_token_ids": True})
        text, ids, finish, usage, metrics = "", [], None, None, None
        async for chunk in stream:
            extra = chunk.model_extra or {}
            if chunk.choices:
                c = chunk.choices[0]
                text += c.text
                ids += (c.model_extra or {}).get("token_ids") or []
                finish = c.finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
            metrics = extra.get("metrics") or metrics
        return {"text": text, "ids": ids, "finish": finish, "usage": usage, "metrics": metrics}

    async def main():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                                      timeout=300) as aclient:
            return await asyncio.gather(*(one(aclient, i) for i in range(n)))

    return asyncio.run(main())


def _check_against_reference(results: list[dict], reference) -> None:
    for i, (r, (ref_text, ref_ids)) in enumerate(zip(results, reference)):
        what = f"prompt {i} ({POLICIES[i % 3]})"
        assert r["ids"] == ref_ids, what
        assert r["text"] == ref_text, what
        assert r["finish"] in ("stop", "length")
        assert r["usage"].completion_tokens == len(r["ids"]), what
        assert r["usage"].total_tokens == r["usage"].prompt_tokens + r["usage"].completion_tokens
        spec = r["metrics"]["speculative_decoding"]
        assert spec["policy"] == POLICIES[i % 3]
        assert 0 <= spec["num_accepted_draft_tokens"] <= spec["num_draft_tokens"], what
        assert sum(spec["acceptance_histogram"]) == spec["num_spec_steps"]
        if POLICIES[i % 3] == "ar":
            assert spec["num_spec_steps"] == 0 and spec["num_draft_tokens"] == 0
        elif POLICIES[i % 3] == "linearspec" and len(r["ids"]) > 1:
            assert spec["num_spec_steps"] > 0
        # Every decoded token is accepted draft or one per round (bonus / correction / AR step).
        rounds = sum(int(n) for n in spec["block_sizes"].values())
        assert len(r["ids"]) - 1 <= spec["num_accepted_draft_tokens"] + rounds


def test_64_concurrent_streams_match_llm_generate(server, reference):
    _check_against_reference(_stream_all(server), reference)


def test_non_streaming_completion_multi_prompt_and_models(client, reference):
    out = client.completions.create(model="nld-tiny", prompt=PROMPTS[:3], max_tokens=MAX_TOKENS, temperature=0,
                                    extra_body={"policy": "ar"})
    assert [c.index for c in out.choices] == [0, 1, 2]
    # Index 0 of the reference is AR too; policies are lossless, so each text equals its AR reference.
    assert out.choices[0].text == reference[0][0]
    assert out.usage.completion_tokens == sum(len(reference[i][1]) for i in range(3))
    assert [m.id for m in client.models.list().data] == ["nld-tiny"]


def test_stop_string_is_not_returned(client, reference):
    text = reference[1][0]
    stop = text[3:6]
    assert stop.strip() and stop in text
    ids = {}
    for policy in ("ar", "linearspec", "recguide"):
        out = client.completions.create(model="nld-tiny", prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0,
                                        stop=[stop], extra_body={"policy": policy, "return_token_ids": True})
        assert out.choices[0].finish_reason == "stop"
        assert out.choices[0].text == text[:text.index(stop)]
        ids[policy] = out.choices[0].token_ids
    # the tokens end with the one that completed the stop string, however many a round emitted
    assert ids["linearspec"] == ids["recguide"] == ids["ar"], ids


def test_completion_logprobs_match_llm_generate(client):
    """Non-streamed and streamed ``logprobs`` under speculation: the AR log-probabilities LLM.generate reports."""
    from recguide_trt import LLM, SamplingParams

    ref = LLM("tiny").generate(PROMPTS[:3], SamplingParams(max_tokens=MAX_TOKENS, policy="ar", logprobs=2))
    out = client.completions.create(model="nld-tiny", prompt=PROMPTS[:3], max_tokens=MAX_TOKENS, temperature=0,
                                    logprobs=2, extra_body={"policy": "linearspec"})
    for c, r in zip(sorted(out.choices, key=lambda c: c.index), ref):
        lp = c.logprobs
        assert lp.token_logprobs == [e.logprob for e in r.logprobs]
        assert [list(d.values()) for d in lp.top_logprobs] == [[v for _, v in e.top] for e in r.logprobs]
        assert "".join(lp.tokens) == c.text == r.text
        assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    stream = client.completions.create(model="nld-tiny", prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                                       logprobs=2, stream=True, extra_body={"policy": "recguide"})
    tokens, values, offsets = [], [], []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].logprobs:
            tokens += chunk.choices[0].logprobs.tokens
            values += chunk.choices[0].logprobs.token_logprobs
            offsets += chunk.choices[0].logprobs.text_offset
    assert values == [e.logprob for e in ref[0].logprobs]
    assert offsets == [len("".join(tokens[:i])) for i in range(len(tokens))]


def test_fields_that_ask_for_nothing_are_accepted(client):
    """The no-op values of fields the server cannot honour (tools [], response_format text, ...) pass, and the
    neutral values of the sampling extras."""
    out = client.completions.create(model="nld-tiny", prompt="def f():", max_tokens=3, temperature=0, extra_body={
        "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "min_tokens": 0, "stop_token_ids": [], "tools": [],
        "tool_choice": "none", "response_format": {"type": "text"}})
    assert out.usage.completion_tokens == 3


def test_penalties_logit_bias_and_stop_token_ids_equal_llm_generate(client):
    """OpenAI's penalties and ``logit_bias`` and vLLM's extras reach SamplingParams under the same names: the same
    tokens as ``LLM.generate`` with them, RecGuide's as AR's; a ``stop_token_ids`` token ends with "stop"."""
    from recguide_trt import LLM, SamplingParams

    llm = LLM("tiny")
    plain = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=24, policy="ar"))[0].token_ids
    fields = dict(frequency_penalty=0.8, presence_penalty=0.3, logit_bias={plain[0]: -100.0})
    extra = dict(repetition_penalty=1.2, top_k=-1, min_tokens=4)
    ref = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=24, policy="ar", **fields, **extra))[0].token_ids
    assert ref != plain and ref[0] != plain[0]
    for policy in ("ar", "recguide"):
        out = client.completions.create(
            model="nld-tiny", prompt=PROMPTS[0], max_tokens=24, temperature=0, **fields,
            extra_body=dict(extra, policy=policy, return_token_ids=True))
        assert out.choices[0].token_ids == ref, policy
    stop = ref[6]
    out = client.completions.create(model="nld-tiny", prompt=PROMPTS[0], max_tokens=24, temperature=0, **fields,
                                    extra_body=dict(extra, stop_token_ids=[stop], return_token_ids=True))
    assert out.choices[0].token_ids == ref[:ref.index(stop) + 1] and out.choices[0].finish_reason == "stop"


def test_n_choices_per_prompt_in_openai_order(client):
    """``n``: prompt i's j-th choice is choices[i * n + j]; greedy choices are equal, seeded ones are seed + j's."""
    from recguide_trt import LLM, SamplingParams

    llm = LLM("tiny")
    out = client.completions.create(model="nld-tiny", prompt=PROMPTS[:2], max_tokens=8, temperature=0, n=2)
    texts = [c.text for c in sorted(out.choices, key=lambda c: c.index)]
    assert len(texts) == 4 and texts[0] == texts[1] and texts[2] == texts[3] and texts[0] != texts[2]
    assert out.usage.prompt_tokens == sum(len(llm.encode(p)) for p in PROMPTS[:2])  # each prompt counted once
    seeded = client.completions.create(model="nld-tiny", prompt=PROMPTS[0], max_tokens=12, temperature=1.0, seed=40,
                                       n=3, extra_body={"policy": "linearspec", "return_token_ids": True})
    for c in seeded.choices:
        ref = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=12, temperature=1.0, seed=40 + c.index,
                                                        policy="linearspec"))[0]
        assert c.model_extra["token_ids"] == ref.token_ids  # choice j is the request seeded with seed + j
    assert len({tuple(c.model_extra["token_ids"]) for c in seeded.choices}) > 1
    chunks = client.completions.create(model="nld-tiny", prompt=PROMPTS[1], max_tokens=8, temperature=0, n=2,
                                       stream=True)
    streamed = {0: "", 1: ""}
    for ch in chunks:
        for c in ch.choices:
            streamed[c.index] += c.text
    assert streamed[0] == streamed[1] == texts[2]


def test_echo_scores_the_prompt_as_lm_eval_asks(client):
    """``echo`` with ``max_tokens`` 0 and ``logprobs`` (lm-eval's loglikelihood request): the prompt back, its first
    token's log-probability null and the others LLM.generate's prompt_logprobs; with max_tokens > 0 the output
    follows."""
    from recguide_trt import LLM, SamplingParams

    llm = LLM("tiny")
    ref = llm.generate(PROMPTS[:2], SamplingParams(max_tokens=4, policy="ar", logprobs=1, prompt_logprobs=1))
    scored = client.completions.create(model="nld-tiny", prompt=PROMPTS[:2], max_tokens=0, echo=True, logprobs=1,
                                       temperature=0)
    assert scored.usage.completion_tokens == 0
    for c, r, p in zip(sorted(scored.choices, key=lambda c: c.index), ref, PROMPTS):
        assert c.text == p
        assert c.logprobs.token_logprobs == [None] + [e.logprob for e in r.prompt_logprobs]
        assert "".join(c.logprobs.tokens) == p and c.logprobs.top_logprobs[0] is None
    both = client.completions.create(model="nld-tiny", prompt=PROMPTS[0], max_tokens=4, echo=True, logprobs=1,
                                     temperature=0, extra_body={"policy": "linearspec"})
    c = both.choices[0]
    assert c.text == PROMPTS[0] + ref[0].text and both.usage.completion_tokens == 4
    assert c.logprobs.token_logprobs == ([None] + [e.logprob for e in ref[0].prompt_logprobs]
                                         + [e.logprob for e in ref[0].logprobs])
    assert c.logprobs.text_offset == [len("".join(c.logprobs.tokens[:i])) for i in range(len(c.logprobs.tokens))]


def test_lm_eval_loglikelihood_request_shape(server):
    """lm-eval's local-completions loglikelihood request: token-id prompts (context + continuation), echo, max_tokens
    1, logprobs 1; it sums token_logprobs[ctxlen:-1] and calls a continuation greedy when each of its log-probabilities
    equals the best of its top_logprobs."""
    from recguide_trt import LLM, SamplingParams

    llm = LLM("tiny")
    ctx = [llm.encode(p) for p in PROMPTS[:3]]
    greedy = llm.generate(ctx, SamplingParams(max_tokens=3, policy="ar"))
    conts = [g.token_ids for g in greedy[:2]] + [[5, 6, 7]]  # two greedy continuations, one that is not
    body = {"model": "nld-tiny", "prompt": [c + t for c, t in zip(ctx, conts)], "temperature": 0, "max_tokens": 1,
            "logprobs": 1, "seed": 1234, "echo": True}
    out = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    ref = llm.generate([c + t for c, t in zip(ctx, conts)], SamplingParams(max_tokens=1, prompt_logprobs=1))
    for choice, c, t, r in zip(sorted(out["choices"], key=lambda x: x["index"]), ctx, conts, ref):
        lps, tops = choice["logprobs"]["token_logprobs"], choice["logprobs"]["top_logprobs"]
        assert len(lps) == len(c) + len(t) + 1
        assert sum(lps[len(c):-1]) == pytest.approx(sum(e.logprob for e in r.prompt_logprobs[len(c) - 1:]))
        is_greedy = all(lp == max(top.values()) for lp, top in zip(lps[len(c):-1], tops[len(c):-1]))
        assert is_greedy == (t != [5, 6, 7])


BAD_REQUESTS = [
    ({"max_tokens": 4}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": "x", "max_tokens": "8"}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 100000}, "max_tokens"),
    ({"prompt": "x", "temperature": "NaN"}, "temperature"),
    ({"prompt": "x", "temperature": -0.5}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "policy": "medusa"}, "policy"),
    ({"prompt": "x", "block_size": 1}, "block_size"),
    ({"prompt": "x", "block_size": 0}, "block_size"),
    ({"prompt": "x", "block_size": 10000}, "block_size"),
    ({"prompt": "x " * 3000}, "prompt"),
    ({"prompt": "x", "model": "gpt-4"}, "model"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 17}, "n"),
    ({"prompt": "x", "n": "2"}, "n"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "seed": -1}, "seed"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": "x", "echo": "yes"}, "echo"),
    ({"prompt": "x", "top_k": -2}, "top_k"),
    ({"prompt": "x", "top_k": 2.5}, "top_k"),
    ({"prompt": "x", "min_p": 2}, "min_p"),
    ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "x", "presence_penalty": 3}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": "high"}, "frequency_penalty"),
    ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": 200}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": [1]}, "logit_bias"),
    ({"prompt": "x", "stop_token_ids": [10**9]}, "stop_token_ids"),
    ({"prompt": "x", "stop_token_ids": 5}, "stop_token_ids"),
    ({"prompt": "x", "min_tokens": -1}, "min_tokens"),
    ({"prompt": "x", "response_format": {"type": "json_object"}}, "response_format"),
    ({"prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"prompt": "x", "guided_json": {"type": "object"}}, "guided_json"),
    ({"prompt": "x", "echo": True, "stream": True}, "echo"),
    ({"prompt": "x", "max_tokens": 0, "echo": False}, "max_tokens"),
]
RAW_BAD = [('{"prompt": "x", "temperature": NaN}', "temperature"),
           ('{"prompt": "x", "temperature": Infinity}', "temperature"),
           ('{"prompt": "x", "temperature": -Infinity}', "temperature"),
           ("this is not json", None), ("[1, 2]", None), ("", None)]


def test_bad_requests_are_400_naming_the_field_and_the_server_keeps_serving(server, client):
    http = httpx.Client(base_url=server.url, timeout=60)
    cases = [(json.dumps(b), p) for b, p in BAD_REQUESTS] + RAW_BAD
    for body, param in cases:
        r = http.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (body[:80], r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
        assert err["param"] == param, (body[:80], err)
        if param is not None:
            assert param in err["message"], err
        else:
            assert "body" in err["message"]
        ok = client.completions.create(model="nld-tiny", prompt="def f():", max_tokens=2, temperature=0,
                                       extra_body={"policy": "ar"})
        assert ok.usage.completion_tokens >= 1
    with pytest.raises(openai.BadRequestError) as info:   # the official client sees the same 400
        client.completions.create(model="nld-tiny", prompt="x", max_tokens=0)
    assert info.value.body["param"] == "max_tokens"


def _random_value(rng: random.Random, depth: int = 0):
    pool = [None, True, False, 0, 1, 2, -1, 3, 7, 2**63, -(2**70), 0.5, 1.0, -2.5, 1e308, "", "x", "ar", "recguide",
            "linearspec", "nld-tiny", "\u00e9\u4e2d", "def f():"]
    kind = rng.random()
    if depth < 3 and kind < 0.15:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 3 and kind < 0.25:
        return {rng.choice(["role", "content", "include_usage", "type", "text", "k"]): _random_value(rng, depth + 1)
                for _ in range(rng.randint(0, 3))}
    return rng.choice(pool)


FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
          "stop", "n", "stream", "stream_options", "policy", "block_size", "ignore_eos", "return_token_ids", "echo",
          "logprobs", "user", "best_of", "presence_penalty", "logit_bias", "top_k", "stop_token_ids", "unknown_field"]


def test_fuzzed_bodies_never_get_a_server_error(server):
    rng = random.Random(17)
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for i in range(300):
            path = "/v1/chat/completions" if i % 3 == 0 else "/v1/completions"
            if i % 25 == 0:
                body = bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
            else:
                obj = {f: _random_value(rng) for f in rng.sample(FIELDS, rng.randint(0, 8))}
                if rng.random() < 0.5:
                    obj["prompt"] = rng.choice(["def f():", [5, 6, 7], ["a", "b"], [[5], [6, 7]]])
                obj.setdefault("max_tokens", rng.choice([1, 2, 3]))
                body = json.dumps(obj).encode()
            r = http.post(path, content=body)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            assert r.status_code in (200, 400), (body[:200], r.status_code, r.text[:300])
            if r.status_code == 400:
                assert set(r.json()["error"]) == {"message", "type", "param", "code"}
            elif r.headers["content-type"].startswith("text/event-stream"):
                assert r.text.rstrip().endswith("data: [DONE]")
    assert statuses.get(200, 0) >= 10 and statuses.get(400, 0) >= 100, statuses
    assert httpx.get(server.url + "/health").status_code == 200


def test_metrics_parse_and_count_what_was_sent(server, client):
    before = parse_metrics(server.url)
    sent = []
    # The fifth request repeats the first prompt: the prefix cache serves all of it but its last token.
    for i, policy in enumerate(["ar", "linearspec", "recguide", "linearspec", "ar"]):
        sent.append(client.completions.create(model="nld-tiny", prompt=PROMPTS[i % 4], max_tokens=6, temperature=0,
                                              extra_body={"policy": policy, "ignore_eos": True}))
    after = parse_metrics(server.url)
    again = sent[-1]
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert again.choices[0].text == sent[0].choices[0].text

    def delta(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("vllm:request_success_total", finished_reason="length") == 5
    assert delta("vllm:prompt_tokens_total") == sum(r.usage.prompt_tokens for r in sent)
    assert delta("vllm:prefix_cache_queries_total") == delta("vllm:prompt_tokens_total")
    assert delta("vllm:prefix_cache_hits_total") == sum(r.usage.prompt_tokens_details.cached_tokens for r in sent)
    assert delta("vllm:generation_tokens_total") == sum(r.usage.completion_tokens for r in sent) == 30
    spec = [r.model_extra["metrics"]["speculative_decoding"] for r in sent]
    assert delta("vllm:spec_decode_num_draft_tokens_total") == sum(s["num_draft_tokens"] for s in spec)
    assert delta("vllm:spec_decode_num_accepted_tokens_total") == sum(s["num_accepted_draft_tokens"] for s in spec)
    assert delta("vllm:spec_decode_num_drafts_total") == sum(s["num_spec_steps"] for s in spec)
    assert delta("vllm:e2e_request_latency_seconds_count") == 5
    assert delta("recguide:requests_total", policy="linearspec") == 2
    assert metric(after, "vllm:num_requests_running") == 0
    assert metric(after, "vllm:kv_cache_usage_perc") == 0


KILLED_CLIENT = textwrap.dedent("""
    import sys, openai
    client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0)
    stream = client.completions.create(model="nld-tiny", prompt="def f(x):", max_tokens=900, temperature=0,
                                       stream=True, extra_body={"policy": "ar", "ignore_eos": True})
    for chunk in stream:
        print("chunk", flush=True)
""")


def test_killed_client_frees_its_request(server, reference):
    before = parse_metrics(server.url)
    proc = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, server.url + "/v1"], stdout=subprocess.PIPE,
                            text=True)
    try:
        for _ in range(3):
            assert proc.stdout.readline().strip() == "chunk"
        assert metric(parse_metrics(server.url), "vllm:num_requests_running") == 1
    finally:
        proc.kill()
        proc.wait(10)
    deadline = time.monotonic() + 20
    while metric(parse_metrics(server.url), "vllm:num_requests_running") != 0:
        assert time.monotonic() < deadline, "the killed client's request is still running"
        time.sleep(0.1)
    after = parse_metrics(server.url)
    assert metric(after, "vllm:request_success_total", finished_reason="abort") - \
        metric(before, "vllm:request_success_total", finished_reason="abort") == 1
    assert metric(after, "vllm:kv_cache_usage_perc") == 0
    _check_against_reference(_stream_all(server), reference)   # full concurrency again, still exact


def test_chat_without_a_template_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="nld-tiny", messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["code"] == "no_chat_template" and "chat template" in info.value.body["message"]


def test_bench_through_the_openai_server(server, tmp_path):
    from tests.serving.openai_server import recguide_command

    res = subprocess.run([*recguide_command(), "bench", "--openai", server.url, "--concurrency", "1,4",
                          "--policies", "ar,linearspec", "--requests", "4", "--max-tokens", "8", "--num-prompts", "8",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads((tmp_path / "openai_results.json").read_text())
    assert [(r["concurrency"], r["policy"]) for r in rows] == [(1, "ar"), (1, "linearspec"), (4, "ar"),
                                                               (4, "linearspec")]
    for r in rows:
        assert r["errors"] == 0 and r["requests"] == max(2 * r["concurrency"], 4)
        assert r["output_tokens"] > 0 and r["ttft_mean"] > 0 and r["output_tok_s"] > 0
    assert rows[1]["acceptance"] is not None and rows[0]["acceptance"] is None   # AR drafts nothing


def test_serve_with_recguide_overrides_runs_them():
    """`recguide serve --recguide switch_concurrency=0`: RecGuide's requests run the adaptive mode only (its metrics),
    and an unknown field or a value the policy refuses is one line naming it, before any model loads."""
    from tests.serving.openai_server import recguide_command

    srv = ServerProcess("--model", "tiny", "--max-num-seqs", "4", "--no-warmup", "--recguide", "switch_concurrency=0")
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"model": "nld-tiny", "prompt": PROMPTS[0], "max_tokens": 12,
                                                          "temperature": 0, "policy": "recguide", "ignore_eos": True},
                       timeout=120)
        assert r.status_code == 200, r.text
        metrics = parse_metrics(srv.url)
        assert metric(metrics, "recguide:mode_steps", mode="adaptive") > 0
        assert metric(metrics, "recguide:mode_steps", mode="overlap") == 0
    finally:
        srv.stop()
    for override, message in (("nosuch=1", "--recguide: unknown field 'nosuch'"),
                              ("hysteresis=0.9", "hysteresis must be in [0, 0.5]")):
        bad = subprocess.run([*recguide_command(), "serve", "--port", "1", "--recguide", override],
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
