"""Write a Triton Inference Server model repository for RecGuide, and run ``tritonserver`` on it.

``recguide triton-repo --model DIR|default --out REPO`` writes::

    REPO/recguide/config.pbtxt      python backend, decoupled, instance group, parameters
    REPO/recguide/1/model.py        a copy of recguide_trt/serving/triton_model.py

The repository holds no weights: ``model.py`` loads the checkpoint named in ``config.pbtxt`` with
the ``recguide_trt`` package installed in the server's Python environment, which needs
``numpy<2`` (see :func:`recguide_trt.serving.triton_protocol.require_numpy_1`).

:class:`TritonServer` starts a real ``tritonserver`` on loopback (the system one when present,
else the one bundled in the ``nvidia-pytriton`` wheel) and stops it with its python-backend stubs;
the tests and ``scripts/serve_triton.sh`` do the same steps.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..backends.choice import (
    BACKENDS,
    add_native_dtype_args,
    check_native_dtypes,
    check_native_dtypes_backend,
)
from ..runtime.params import POLICIES
from .ports import free_port
from .process_table import pids_in
from .triton_protocol import INPUTS, OUTPUTS

MODEL_NAME = "recguide"
MODEL_SOURCE = Path(__file__).resolve().with_name("triton_model.py")
STUB_NAME = "triton_python_backend_stub"


# -- the repository --------------------------------------------------------------------------
def _pbtxt_str(value: str) -> str:
    return json.dumps(str(value))  # a JSON string literal is a valid protobuf text string


def config_pbtxt(*, model_path: str, backend: str = "torch", instance_kind: str = "cpu", instance_count: int = 1,
                 default_policy: str = "recguide", max_tokens_limit: int = 512, max_num_seqs: int = 64,
                 max_model_len: int | None = None, dtype: str | None = None, torch_threads: int | None = None,
                 execution_env: str | None = None, model_name: str = MODEL_NAME, compute_dtype: str | None = None,
                 kv_cache_dtype: str | None = None, prefix_cache: bool = True,
                 recguide: list[str] | None = None) -> str:
    """The text of ``config.pbtxt`` (``recguide``: ``FIELD=VALUE`` overrides of RecGuide's config, kept as a JSON
    list in the ``recguide`` parameter)."""
    lines = [f"name: {_pbtxt_str(model_name)}", 'backend: "python"', "max_batch_size: 0",
             "model_transaction_policy { decoupled: true }", ""]
    for section, specs in (("input", INPUTS), ("output", OUTPUTS)):
        lines.append(f"{section} [")
        for i, s in enumerate(specs):
            opt = " optional: true" if section == "input" and s.optional else ""
            comma = "," if i < len(specs) - 1 else ""
            dims = ", ".join(str(d) for d in s.dims)
            lines.append(f"  {{ name: {_pbtxt_str(s.name)} data_type: TYPE_{s.triton_type} dims: [ {dims} ]{opt} }}"
                         f"{comma}")
        lines.append("]")
    kind = {"cpu": "KIND_CPU", "gpu": "KIND_GPU"}[instance_kind]
    lines += ["", f"instance_group [ {{ count: {int(instance_count)} kind: {kind} }} ]", ""]
    params = {"model_path": model_path, "backend": backend, "default_policy": default_policy,
              "max_tokens_limit": str(int(max_tokens_limit)), "max_num_seqs": str(int(max_num_seqs))}
    if max_model_len is not None:
        params["max_model_len"] = str(int(max_model_len))
    if dtype:
        params["dtype"] = dtype
    if compute_dtype:
        params["compute_dtype"] = compute_dtype
    if kv_cache_dtype:
        params["kv_cache_dtype"] = kv_cache_dtype
    if torch_threads:
        params["torch_threads"] = str(int(torch_threads))
    if not prefix_cache:
        params["prefix_cache"] = "false"
    if recguide:
        params["recguide"] = json.dumps(list(recguide))
    if execution_env:
        params["EXECUTION_ENV_PATH"] = execution_env
    for key, value in params.items():
        lines.append(f"parameters {{ key: {_pbtxt_str(key)} value: {{ string_value: {_pbtxt_str(value)} }} }}")
    return "\n".join(lines) + "\n"


def _check_model(model: str | None) -> str:
    """Resolve ``model`` (a name, imported into the model cache on first use, or a checkpoint dir) to the
    absolute checkpoint path config.pbtxt names, with clear errors."""
    from ..models import resolve_model

    path = resolve_model(model or None).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"--model {model}: no config.json there (expected a checkpoint directory)")
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"--model {model}: no tokenizer.json there; the Triton model takes and returns "
                                f"text, so the checkpoint needs its tokenizer")
    return str(path)


def write_repository(out: str | Path, model: str = "default", backend: str = "torch", instance_kind: str = "cpu",
                     instance_count: int = 1, policy: str = "recguide", max_tokens_limit: int = 512,
                     max_num_seqs: int = 64, max_model_len: int | None = None, dtype: str | None = None,
                     torch_threads: int | None = None, execution_env: str | Path | None = None,
                     model_name: str = MODEL_NAME, compute_dtype: str | None = None,
                     kv_cache_dtype: str | None = None, prefix_cache: bool = True,
                     recguide: list[str] | None = None) -> Path:
    """Write (or refresh) the model repository at ``out``; returns the model's directory.

    ``execution_env``: an environment directory for the stub (EXECUTION_ENV_PATH), e.g. a venv with
    numpy<2; None uses the ``python3`` first on tritonserver's PATH. ``compute_dtype`` / ``kv_cache_dtype``:
    the native backend's bf16 options (``LLM(compute_dtype=..., kv_cache_dtype=...)`` in each instance).
    ``recguide``: ``FIELD=VALUE`` overrides of RecGuide's config in each instance, checked here
    (:func:`~recguide_trt.runtime.config_overrides.recguide_config`), before anything is written.
    """
    from ..runtime.config_overrides import recguide_config

    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    check_native_dtypes(compute_dtype, kv_cache_dtype)
    check_native_dtypes_backend(backend, compute_dtype, kv_cache_dtype)
    if instance_kind not in ("cpu", "gpu"):
        raise ValueError(f"unknown instance kind {instance_kind!r}; choose cpu or gpu")
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if max_tokens_limit <= 0:
        raise ValueError(f"--max-tokens-limit must be positive, got {max_tokens_limit}")
    if instance_count <= 0:
        raise ValueError(f"--instances must be positive, got {instance_count}")
    recguide_config(recguide)
    model_path = _check_model(model)
    env_path = None
    if execution_env is not None:
        env = Path(execution_env).expanduser().resolve()
        if not (env / "bin" / "python3").exists() and not str(env).endswith(".tar.gz"):
            raise FileNotFoundError(f"--execution-env {execution_env}: no bin/python3 there (expected a venv/conda "
                                    f"environment directory or a conda-pack .tar.gz)")
        env_path = str(env)

    root = Path(out).expanduser().resolve()
    model_dir = root / model_name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config_pbtxt(
        model_path=model_path, backend=backend, instance_kind=instance_kind, instance_count=instance_count,
        default_policy=policy, max_tokens_limit=max_tokens_limit, max_num_seqs=max_num_seqs,
        max_model_len=max_model_len, dtype=dtype, torch_threads=torch_threads, execution_env=env_path,
        model_name=model_name, compute_dtype=compute_dtype, kv_cache_dtype=kv_cache_dtype,
        prefix_cache=prefix_cache, recguide=recguide))
    shutil.copyfile(MODEL_SOURCE, model_dir / "1" / "model.py")
    return model_dir


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="recguide triton-repo",
                                description="Write a Triton Inference Server model repository (python backend, "
                                            "decoupled streaming) serving a RecGuide checkpoint.")
    p.add_argument("--model", default="default", help="checkpoint directory with tokenizer.json, or 'default' "
                                                      "(the embedded tiny model)")
    p.add_argument("--backend", default="torch", choices=BACKENDS)
    p.add_argument("--out", required=True, help="repository directory to write")
    p.add_argument("--instance-kind", default="cpu", choices=["cpu", "gpu"],
                   help="KIND_CPU (device cpu) or KIND_GPU (device cuda:<instance device>)")
    p.add_argument("--instances", type=int, default=1, help="model instances (each has its own LLM and loop)")
    p.add_argument("--policy", default="recguide", choices=POLICIES, help="default policy of requests")
    p.add_argument("--max-tokens-limit", type=int, default=512, help="largest max_tokens a request may ask")
    p.add_argument("--max-num-seqs", type=int, default=64, help="requests decoded concurrently per instance")
    p.add_argument("--max-model-len", type=int, default=None, help="prompt + output tokens per request")
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="prefill every prompt in full (the engine's prefix cache off; for benchmarks that replay prompts)")
    p.add_argument("--recguide", action="append", default=None, metavar="FIELD=VALUE",
                   help="set a field of the RecGuide policy's config in each instance (RecGuideConfig; repeatable), "
                        "as `recguide serve --recguide` does")
    p.add_argument("--dtype", default=None, help="float32 (default), bfloat16 or float16")
    add_native_dtype_args(p)
    p.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads in each instance")
    p.add_argument("--execution-env", default=None,
                   help="environment directory for the python backend (EXECUTION_ENV_PATH); it needs numpy<2")
    p.add_argument("--model-name", default=MODEL_NAME)
    return p


def main(argv: list[str] | None = None) -> int:
    """``recguide triton-repo ...``; returns the exit code."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Write the repository from parsed :func:`build_parser` arguments; returns the exit code."""
    try:
        model_dir = write_repository(
            args.out, model=args.model, backend=args.backend, instance_kind=args.instance_kind,
            instance_count=args.instances, policy=args.policy, max_tokens_limit=args.max_tokens_limit,
            max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len, dtype=args.dtype,
            torch_threads=args.torch_threads, execution_env=args.execution_env,
            model_name=args.model_name, compute_dtype=args.compute_dtype, kv_cache_dtype=args.kv_cache_dtype,
            prefix_cache=not args.no_prefix_cache, recguide=args.recguide)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {model_dir}/config.pbtxt and {model_dir}/1/model.py")
    print(f"serve: tritonserver --model-repository {model_dir.parent} (see scripts/serve_triton.sh)")
    return 0


# -- running tritonserver ----------------------------------------------------------------------
_PROBE = r"""
import json, sys, sysconfig
info = {"python": sys.executable, "prefix": sys.prefix, "version": "%d.%d" % sys.version_info[:2],
        "libdir": sysconfig.get_config_var("LIBDIR")}
try:
    import numpy
    info["numpy"] = numpy.__version__
except ImportError:
    info["numpy"] = None
try:
    import pytriton, os
    info["pytriton"] = os.path.dirname(pytriton.__file__)
except ImportError:
    info["pytriton"] = None
try:
    import importlib.util
    info["recguide_trt"] = importlib.util.find_spec("recguide_trt") is not None
except Exception:
    info["recguide_trt"] = False
print(json.dumps(info))
"""


def probe_python(python: str | Path) -> dict:
    """What a Python environment offers a Triton server: numpy version, pytriton, LIBDIR, the package."""
    out = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def serving_problem(info: dict) -> str | None:
    """Why an environment (from :func:`probe_python`) cannot host the model, or None."""
    if info.get("numpy") is None:
        return f"numpy is not installed in {info['prefix']}"
    if int(info["numpy"].split(".")[0]) >= 2:
        return (f"{info['prefix']} has numpy {info['numpy']}; Triton's python backend stub needs numpy<2 "
                f"(pip install 'recguide-trt[triton]' -c constraints.txt in a separate environment)")
    if not info.get("recguide_trt"):
        return f"recguide_trt is not installed in {info['prefix']}"
    return None


def hosting_problem(python: str | Path) -> str | None:
    """Why a Triton server cannot be run with ``python``'s environment (its packages, or no tritonserver
    binary to be found), or None."""
    info = probe_python(python)
    problem = serving_problem(info)
    if problem is None:
        try:
            find_tritonserver(info)
        except FileNotFoundError as exc:
            problem = str(exc)
    return problem


def find_tritonserver(info: dict) -> tuple[Path, Path | None]:
    """``(binary, pytriton_dist)``: the system tritonserver when on PATH or in /opt/tritonserver
    (pytriton_dist None), else the one bundled in nvidia-pytriton and that distribution's folder."""
    system = shutil.which("tritonserver") or ("/opt/tritonserver/bin/tritonserver"
                                              if Path("/opt/tritonserver/bin/tritonserver").is_file() else None)
    if system:
        return Path(system), None
    if not info.get("pytriton"):
        raise FileNotFoundError("no tritonserver on PATH and nvidia-pytriton is not installed in "
                                f"{info['prefix']} (pip install nvidia-pytriton)")
    dist = Path(info["pytriton"]) / "tritonserver"
    return dist / "bin" / "tritonserver", dist


def pytriton_backend_dir(dist: Path, python_version: str, dest: str | Path) -> Path:
    """A ``--backend-directory`` for the pytriton-bundled server: its python backend plus the stub
    built for ``python_version`` (the wheel keeps stubs aside, one per Python version; Triton
    looks for ``triton_python_backend_stub`` in the backend's folder). Symlinks, no copies."""
    dest = Path(dest)
    py = dest / "python"
    py.mkdir(parents=True, exist_ok=True)
    stub = dist / "python_backend_stubs" / python_version / STUB_NAME
    if not stub.is_file():
        raise FileNotFoundError(f"nvidia-pytriton has no python backend stub for Python {python_version} ({stub})")
    links = {f.name: f for f in (dist / "backends" / "python").iterdir() if f.is_file()}
    links[STUB_NAME] = stub
    for name, target in links.items():
        link = py / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    return dest


def server_environment(info: dict, base: dict | None = None) -> dict:
    """The environment tritonserver needs: the serving env's bin/ first on PATH (the python-backend
    stub runs the first ``python3`` there), the interpreter's LIBDIR (libpython for the stub) and,
    for the pytriton-bundled server, the wheel's ``nvidia_pytriton.libs`` on LD_LIBRARY_PATH."""
    env = dict(os.environ if base is None else base)
    bindir = str(Path(info["python"]).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    libs = [info["libdir"]] if info.get("libdir") else []
    if info.get("pytriton"):
        wheel_libs = Path(info["pytriton"]).parent / "nvidia_pytriton.libs"
        if wheel_libs.is_dir():
            libs.append(str(wheel_libs))
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
    env.pop("PYTHONHOME", None)
    return env


def _group_pids(pgid: int) -> list[int]:
    return pids_in(pgrp=pgid)


class TritonServer:
    """A ``tritonserver`` on 127.0.0.1 in its own process group (stubs included), for tests and tools.

    ``python`` is the serving environment's interpreter (numpy<2, recguide_trt, nvidia-pytriton when
    no system tritonserver exists).
    """

    def __init__(self, repo: str | Path, python: str | Path = sys.executable, log_path: str | Path | None = None,
                 extra_args: tuple[str, ...] = (), env: dict | None = None):
        self.repo = Path(repo)
        self.info = probe_python(python)
        problem = serving_problem(self.info)
        if problem:
            raise RuntimeError(problem)
        self.binary, dist = find_tritonserver(self.info)
        self.backend_dir = None
        if dist is not None:
            self.backend_dir = pytriton_backend_dir(dist, self.info["version"], self.repo.parent / "triton-backends")
        self.http_port, self.grpc_port = free_port(), free_port()
        self.log_path = Path(log_path) if log_path else self.repo.parent / "tritonserver.log"
        self.extra_args = tuple(extra_args)
        self.env = server_environment(self.info, env)
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def command(self) -> list[str]:
        cmd = [str(self.binary), f"--model-repository={self.repo}", "--http-address=127.0.0.1",
               f"--http-port={self.http_port}", "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc_port}",
               "--allow-metrics=false", "--log-verbose=0", "--exit-timeout-secs=20"]
        if self.backend_dir is not None:
            cmd.append(f"--backend-directory={self.backend_dir}")
        return cmd + list(self.extra_args)

    def start(self) -> TritonServer:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)
        return self

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 180.0, model: str = MODEL_NAME) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://{self.http_url}/v2/models/{model}/ready"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"tritonserver not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def leftover_pids(self) -> list[int]:
        """Live processes of the server's process group (the server and its stubs)."""
        return _group_pids(self.proc.pid) if self.proc is not None else []

    def stop(self, timeout: float = 40.0) -> int | None:
        """SIGTERM (Triton unloads the models, stubs exit), then SIGKILL of the whole group if needed.
        Returns the server's exit code (None if it had to be killed)."""
        if self.proc is None:
            return None
        code = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                code = None
        else:
            code = self.proc.returncode
        deadline = time.monotonic() + 10
        while self.leftover_pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.leftover_pids():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            code = None
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    raise SystemExit(main())
