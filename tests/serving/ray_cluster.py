"""A real multi-node Ray cluster on loopback for the Ray Serve tests: a head and worker nodes, each a
``ray start --block`` in its own session, stopped by the sessions this module started.

Why not ``ray stop``: it kills every Ray process of the user, and other work on the machine may run
a cluster of its own. Each node's ``ray start --block`` leads a new session (``setsid``); the GCS,
raylet, agents and the raylet's workers all stay in it, so stopping a node is SIGTERM to its leader
(Ray's graceful stop), then SIGKILL to whatever of that session is still there. Every port is a
free one and the temp dir is this cluster's own, so two clusters on one machine do not meet.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from recguide_trt.serving.ports import free_port
from recguide_trt.serving.process_table import pids_in

READY = "Ray runtime started"
CLUSTER_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
"""For every node and the driver. Auth explicitly off: with ``RAY_AUTH_MODE`` unset, a head enables token
auth whenever ``~/.ray/auth_token`` exists (any earlier local ``ray.init()`` writes one) and a worker
node started without the token then cannot join. This cluster listens on loopback only."""


def ray_command() -> str:
    script = Path(sys.executable).parent / "ray"
    return str(script) if script.is_file() else "ray"


def session_pids(sid: int) -> list[int]:
    """PIDs of the processes whose session is ``sid``."""
    return pids_in(session=sid)


def process_title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class RayCluster:
    """``RayCluster(cpus=(1, 1))``: a head with 1 CPU and one worker node with 1 CPU."""

    def __init__(self, cpus: tuple[int, ...] = (1, 1), env: dict | None = None, startup_s: float = 90.0):
        # Short: Ray's unix sockets live under it (a socket path may have 107 bytes at most).
        self.temp_dir = tempfile.mkdtemp(prefix="rgray-", dir="/tmp")
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = dict(os.environ, **CLUSTER_ENV, **(env or {}))
        self.nodes: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        try:
            for i, n in enumerate(cpus):
                self._start_node(i, n, startup_s)
        except BaseException:
            self.stop()
            raise

    def _start_node(self, i: int, cpus: int, startup_s: float) -> None:
        common = ["--block", "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}", "--num-gpus=0",
                  "--disable-usage-stats", "--object-store-memory=100000000",
                  f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}"]
        if i == 0:
            args = ["--head", f"--port={self.port}", f"--temp-dir={self.temp_dir}", "--include-dashboard=false",
                    f"--dashboard-port={free_port()}", f"--ray-client-server-port={free_port()}"]
        else:
            args = [f"--address={self.address}"]
        log = Path(self.temp_dir) / f"node{i}.log"
        self.logs.append(log)
        with open(log, "w") as f:
            proc = subprocess.Popen([ray_command(), "start", *args, *common], stdout=f, stderr=subprocess.STDOUT,
                                    env=self.env, start_new_session=True)
        self.nodes.append(proc)
        deadline = time.monotonic() + startup_s
        while READY not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start (node {i}) failed:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)

    def pids(self) -> list[int]:
        """Every live process of this cluster (all nodes' sessions)."""
        return [p for node in self.nodes for p in session_pids(node.pid)]

    def find(self, title_prefix: str) -> list[int]:
        """PIDs of this cluster's processes whose title starts with ``title_prefix`` (Ray names its workers)."""
        return [p for p in self.pids() if process_title(p).startswith(title_prefix)]

    def stop(self, timeout: float = 20.0) -> list[int]:
        """Stop every node (workers first); returns the PIDs that survived (none, normally).

        The temp dir (the nodes' logs) is removed once nothing is left running in it."""
        for proc in reversed(self.nodes):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.nodes:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.nodes:
            if proc.poll() is None:
                proc.wait(10)
        time.sleep(0.5)
        left = self.pids()
        if not left:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        return left
