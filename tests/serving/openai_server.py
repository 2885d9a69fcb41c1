"""A real ``recguide serve`` process on a free loopback port, for the OpenAI server tests."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time

import httpx

from recguide_trt.cli import console_command
from recguide_trt.serving.ports import free_port


def recguide_command() -> list[str]:
    """The console script next to this interpreter (what a user runs), else ``python -m recguide_trt.cli``."""
    return console_command()


class ServerProcess:
    """Starts ``recguide serve ARGS`` on 127.0.0.1 and waits for /health; :meth:`stop` ends it."""

    def __init__(self, *args: str, startup_s: float = 180.0, env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), **(env or {}))
        # A file, not a pipe: nobody reads a pipe while the tests run, and a full one would block the server.
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([*recguide_command(), "serve", "--port", str(self.port), *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, text=True, env=env,
                                     start_new_session=True)
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"recguide serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"recguide serve did not become healthy in {startup_s} s")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (uvicorn's graceful shutdown), SIGKILL after ``timeout``; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()


def parse_metrics(url: str) -> dict[tuple[str, tuple], float]:
    """/metrics parsed with prometheus_client's text parser: {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(samples: dict, name: str, **labels) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels`` (0 when absent)."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))
