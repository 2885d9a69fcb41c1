"""scripts/probe_endpoints.py as a user runs it (a subprocess), against a real single-process ``recguide serve``
whose two slots it fills, waiting on /metrics and with --settle. (Against Ray replicas: tests/serving/test_ray_serve.py, through the same function.)"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import has_embedded
from tests.scripts.runner import run_script
from tests.serving.openai_server import ServerProcess


def run(*args: str) -> subprocess.CompletedProcess:
    return run_script("probe_endpoints.py", *args, timeout=300)


@pytest.mark.skipif(not has_embedded(), reason="embedded model not trained yet")
def test_probes_a_full_server(tmp_path):
    srv = ServerProcess("--model", "tiny", "--max-num-seqs", "2", "--max-model-len", "2048", "--no-warmup",
                        "--api-key", "sekrit")
    try:
        for extra, how in (((), "after /metrics showed them running"), (("--settle", "1"), "1 s after sending")):
            r = run("--url", srv.url, "--requests", "2", "--api-key", "sekrit", "--out", str(tmp_path / "p.json"),
                    *extra)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
            res = json.loads((tmp_path / "p.json").read_text())
            assert [p["path"] for p in res["probes"]] == ["/health", "/v1/models", "/metrics"]
            assert [p["status"] for p in res["probes"]] == [200, 200, 200]
            assert [p["requests_ended"] for p in res["probes"]] == [0, 0, 0]
            assert res["probes"][2]["running"] == {"": 2.0}
            assert "| /metrics | 200 |" in r.stdout and how in r.stdout
        r = run("--url", srv.url, "--requests", "2")        # no key: the model list is refused, said in one line
        assert r.returncode == 1 and "GET /v1/models gave no model name" in r.stderr and "Traceback" not in r.stderr
    finally:
        srv.stop()


def test_bad_values_say_which_option():
    r = run("--url", "http://127.0.0.1:9", "--requests", "0")
    assert r.returncode == 1 and "--requests must be >= 1" in r.stderr
    r = run("--url", "http://127.0.0.1:9", "--requests", "1", "--settle", "-1")
    assert r.returncode == 1 and "--settle must be >= 0" in r.stderr
    r = run("--url", "http://127.0.0.1:9", "--requests", "1")   # nothing listens there
    assert r.returncode == 1 and "--url http://127.0.0.1:9: GET /v1/models gave no model name" in r.stderr
