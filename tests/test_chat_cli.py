"""Chatting with the default model (SmolLM2-135M-Instruct) as users do: ``recguide generate --chat``,
``recguide chat`` (piped and on a terminal) and the OpenAI server's /v1/chat/completions.

Every command runs the real console script. Greedy decoding with ``--policy ar`` (no step-cost table to
measure) and small ``--max-tokens`` keep each run to the model load plus a fraction of a second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from recguide_trt.model.chat_template import load_chat_template
from recguide_trt.model.tokenizer import Tokenizer
from recguide_trt.models import resolve_model
from tests.serving.openai_server import ServerProcess, recguide_command

ENV = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
FRANCE = "What is the capital of France?"
FOLLOW_UP = "What is the population of that city?"
"""Answered about Paris only when the first question is in the conversation (alone: New York)."""
PIRATE = "You are a pirate named Blackbeard."


@pytest.fixture(scope="module")
def smollm2():
    """The default model's checkpoint directory (imported into the model cache here, once, if it is not yet)."""
    return resolve_model("smollm2-135m")


def recguide(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*recguide_command(), *args], input=stdin, capture_output=True, text=True, env=ENV,
                          timeout=timeout)


def test_generate_chat_prints_only_the_answer(smollm2):
    res = recguide("generate", FRANCE, "--chat", "--max-tokens", "32", "--policy", "ar")
    assert res.returncode == 0, res.stderr
    assert "Paris" in res.stdout
    assert FRANCE not in res.stdout and "<|im" not in res.stdout and "assistant" not in res.stdout


def test_generate_chat_stream_honours_system(smollm2):
    res = recguide("generate", "What is your name?", "--chat", "--stream", "--system", PIRATE, "--max-tokens", "12",
                   "--policy", "ar")
    assert res.returncode == 0, res.stderr
    assert "Blackbeard" in res.stdout and "What is your name?" not in res.stdout


def test_system_message_is_rendered_first_in_place_of_the_default(smollm2):
    render = load_chat_template(smollm2)  # what LLM.chat_prompt applies
    user = [{"role": "user", "content": "hi"}]
    default, pirate = render(user), render([{"role": "system", "content": PIRATE}, *user])
    assert pirate == f"<|im_start|>system\n{PIRATE}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert PIRATE not in default and "SmolLM" in default  # without --system: the template's own


def test_chat_keeps_the_conversation_until_reset(smollm2):
    lines = [FRANCE, "", FOLLOW_UP, "/reset", FOLLOW_UP]
    res = recguide("chat", "--max-tokens", "24", "--policy", "ar", stdin="\n".join(lines) + "\n")
    assert res.returncode == 0, res.stderr  # at EOF
    answers = res.stdout.splitlines()  # piped: no prompt marker, one line per (one-line) answer
    assert len(answers) == 3, res.stdout
    assert "Paris" in answers[0]
    assert "Paris" in answers[1]      # "that city": the first question is in the conversation
    assert "Paris" not in answers[2]  # after /reset it is not


def test_chat_system_and_exit(smollm2):
    res = recguide("chat", "--max-tokens", "12", "--policy", "ar", "--system", PIRATE,
                   stdin="What is your name?\n/nope\n/exit\nWhat is your name?")
    assert res.returncode == 0, res.stderr
    assert "Blackbeard" in res.stdout and res.stdout.endswith("\n") and len(res.stdout.splitlines()) == 1
    assert "unknown command /nope" in res.stderr


@pytest.mark.parametrize("argv", [["generate", "hi", "--chat"], ["chat"]])
def test_a_model_without_a_chat_template_is_one_error_line(argv):
    res = recguide(*argv, "--model", "tiny", stdin="hi\n", timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    err = res.stderr.strip()
    assert err.startswith("error: model 'tiny' has no chat template") and len(err.splitlines()) == 1, err


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_chat_on_a_terminal_ctrl_c_cancels_the_answer(smollm2):
    """On a TTY: the "> " prompt, Ctrl-C mid-answer drops that turn (the conversation goes on), Ctrl-D ends it."""
    import pty
    import select

    pid, fd = pty.fork()
    if pid == 0:  # the child: recguide chat on the pseudo-terminal
        try:
            # A shell's background job starts with SIGINT ignored, and Python keeps an ignored SIGINT: give the
            # child the terminal's default, as an interactive shell would.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(recguide_command()[0], [*recguide_command(), "chat", "--max-tokens", "400", "--policy", "ar"],
                      ENV)
        finally:
            os._exit(127)
    out = bytearray()

    def until(needle: bytes, start: int, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while (i := out.find(needle, start)) < 0:
            assert time.monotonic() < deadline, f"no {needle!r} in:\n{out.decode(errors='replace')}"
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    out.extend(os.read(fd, 4096))
                except OSError:  # the child is gone
                    break
        return i + len(needle)

    try:
        at = until(b"> ", 0)
        os.write(fd, FRANCE.encode() + b"\r")
        at = until(b"> ", until(b"Paris", at))
        os.write(fd, b"Write a long story about a dragon.\r")
        at = until(b"dragon.\r\n", at)
        until(b" ", at)                   # the answer has started: interrupt it
        os.write(fd, b"\x03")
        at = until(b"(answer cancelled)", at)
        at = until(b"> ", at)
        os.write(fd, FOLLOW_UP.encode() + b"\r")
        at = until(b"> ", until(b"Paris", at))  # the cancelled turn was dropped, the first one kept
        os.write(fd, b"\x04")             # Ctrl-D
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.waitstatus_to_exitcode(status) == 0, out.decode(errors="replace")
    finally:
        if pid:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)


def test_openai_chat_completions_apply_the_template_and_stop_at_im_end(smollm2):
    messages = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": FRANCE}]
    prompt_tokens = len(Tokenizer(smollm2 / "tokenizer.json").encode(load_chat_template(smollm2)(messages)))
    body = {"model": "smollm2-135m", "messages": messages, "max_tokens": 32, "temperature": 0, "policy": "ar",
            "return_token_ids": True}
    server = ServerProcess("--no-warmup", "--max-num-seqs", "1")
    try:
        res = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
        choice = res["choices"][0]
        assert "Paris" in choice["message"]["content"] and "<|im" not in choice["message"]["content"]
        assert choice["finish_reason"] == "stop" and choice["token_ids"][-1] == 2  # <|im_end|>, the eos
        assert res["usage"]["prompt_tokens"] == prompt_tokens  # the very prompt LLM.chat_prompt renders
        streamed = ""
        with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True},
                          timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    streamed += json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        assert streamed == choice["message"]["content"]
    finally:
        assert server.stop() == 0, server.output()


THINK_OFF = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def thinking_model(smollm2, tmp_path_factory):
    """SmolLM2 with a chat template that reads Qwen3's ``enable_thinking`` (its ending: an empty think block when
    thinking is off); every other file linked to the cached checkpoint's."""
    out = tmp_path_factory.mktemp("thinking") / "smollm2-thinking"
    out.mkdir()
    for f in smollm2.iterdir():
        if f.name != "tokenizer_config.json":
            (out / f.name).symlink_to(f)
    cfg = json.loads((smollm2 / "tokenizer_config.json").read_text())
    cfg["chat_template"] += "{%- if add_generation_prompt and enable_thinking is defined and enable_thinking is false %}" \
                            + THINK_OFF.replace("\n", "\\n").join(["{{- '", "' }}"]) + "{%- endif %}"
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return out


def test_chat_template_kwargs_reach_the_template(thinking_model):
    """vLLM's ``chat_template_kwargs`` (Qwen3's ``{"enable_thinking": false}``): the template sees them in the CLI
    (``--chat-template-kwargs``) and the server, as transformers' ``apply_chat_template(**kwargs)`` passes them;
    bad values are one error naming the flag, or a 400 naming the field."""
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": FRANCE}]
    render = load_chat_template(thinking_model)
    plain, off = render(messages), render(messages, enable_thinking=False)
    assert off == plain + THINK_OFF
    theirs = AutoTokenizer.from_pretrained(str(thinking_model))
    assert off == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    n_plain, n_off = (len(Tokenizer(thinking_model / "tokenizer.json").encode(t)) for t in (plain, off))
    assert n_off > n_plain

    kw = ["--chat-template-kwargs", '{"enable_thinking": false}']
    res = recguide("generate", FRANCE, "--chat", "--model", str(thinking_model), "--max-tokens", "2", "--policy", "ar",
                   "--stats", *kw)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stderr[res.stderr.index("{"):])["prompt_tokens"] == n_off  # (without: the server's check)
    for bad, needle in (('{"enable_thinking": ', "--chat-template-kwargs is not JSON"),
                        ('{"messages": []}', "may not set 'messages'")):
        res = recguide("generate", FRANCE, "--chat", "--model", str(thinking_model), "--chat-template-kwargs", bad)
        assert res.returncode != 0 and res.stderr.strip().splitlines()[-1].startswith("error:") and needle in res.stderr
    res = recguide("generate", FRANCE, *kw)  # not a chat
    assert res.returncode != 0 and "--chat-template-kwargs is a chat setting: add --chat" in res.stderr

    server = ServerProcess("--model", str(thinking_model), "--no-warmup", "--max-num-seqs", "1")
    try:
        body = {"model": thinking_model.name, "messages": messages, "max_tokens": 2, "temperature": 0, "policy": "ar"}
        for extra, want in (({}, n_plain), ({"chat_template_kwargs": {"enable_thinking": False}}, n_off)):
            res = httpx.post(server.url + "/v1/chat/completions", json={**body, **extra}, timeout=60)
            assert res.status_code == 200 and res.json()["usage"]["prompt_tokens"] == want, res.text
        for bad in ([1], {"add_generation_prompt": False}, "x"):
            res = httpx.post(server.url + "/v1/chat/completions", json={**body, "chat_template_kwargs": bad}, timeout=60)
            assert res.status_code == 400 and res.json()["error"]["param"] == "chat_template_kwargs", res.text
    finally:
        assert server.stop() == 0, server.output()
