"""Our OpenAI server and ``vllm serve`` measured by vLLM's own benchmark client, same weights, one run.

    python scripts/bench_vllm_client.py --vllm-venv /tmp/recguide-peers/vllm [--concurrency 1,16]
        [--num-prompts 32] [--rounds 2] [--out docs/real_model/vllm_client.md]

``vllm bench serve --backend openai --dataset-name random --random-input-len 256 --random-output-len
128 --ignore-eos`` runs against ``recguide serve --model M`` and against ``vllm serve`` on the same
weights (our checkpoint converted to a Hugging Face Llama directory, bf16 and float32 compute),
servers alternating in order round by round; each server has the machine to itself while it is
measured. The vLLM venv comes from ``bash scripts/setup_peers.sh vllm``. Prints (and writes) the
best round per server and C, and each row's ratio to ours.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from recguide_trt.bench.peers import convert
from recguide_trt.bench.peers.machine import cpu_model
from recguide_trt.cli import console_command
from recguide_trt.models import resolve_model
from recguide_trt.serving.ports import free_port

METRICS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "completed")


class Server:
    def __init__(self, cmd: list[str], env: dict, log: Path, port: int, startup_s: float = 600):
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited with {self.proc.returncode}; see {log}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{' '.join(cmd[:3])} did not become healthy in {startup_s} s; see {log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-venv", type=Path, default=Path("/tmp/recguide-peers/vllm"))
    ap.add_argument("--model", default="smollm2-135m", help="a model name or checkpoint directory")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--servers", default="ours,vllm-bf16,vllm-fp32")
    ap.add_argument("--out", default="docs/real_model/vllm_client.md")
    a = ap.parse_args(argv)
    vllm = a.vllm_venv / "bin" / "vllm"
    if not vllm.is_file():
        ap.error(f"no {vllm}: run bash scripts/setup_peers.sh vllm first")
    ckpt = resolve_model(a.model)
    name = ckpt.name
    work = Path(tempfile.mkdtemp(prefix="recguide-vllm-client-"))
    hf = convert.to_hf(ckpt, work / "hf")
    conc = [int(c) for c in a.concurrency.split(",")]
    threads = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false",
               "HF_HUB_OFFLINE": "1"}
    iomp = sorted(a.vllm_venv.glob("lib/libiomp5.so"))
    # vLLM's CPU default reserves a core for its API server and runs the model on the rest: on a 2-core
    # machine one core, several times slower here than with both cores for the model.
    vllm_env = dict(os.environ, **threads, VLLM_CPU_KVCACHE_SPACE="4", VLLM_TARGET_DEVICE="cpu",
                    VLLM_CPU_OMP_THREADS_BIND=f"0-{(os.cpu_count() or 2) - 1}", VLLM_CPU_NUM_OF_RESERVED_CPU="0",
                    **({"LD_PRELOAD": str(iomp[0])} if iomp else {}))

    def command(server: str, port: int) -> tuple[list[str], dict]:
        if server == "ours":
            return ([*console_command(), "serve", "--model", str(ckpt), "--port", str(port), "--served-model-name", name,
                     "--max-num-seqs", str(max(conc))],
                    dict(os.environ, **threads))
        dtype = {"vllm-bf16": "bfloat16", "vllm-fp32": "float32"}[server]
        return ([str(vllm), "serve", str(hf), "--port", str(port), "--dtype", dtype, "--tokenizer", str(ckpt),
                 "--served-model-name", name, "--max-model-len", "1024", "--max-num-seqs", str(max(conc))], vllm_env)

    servers = a.servers.split(",")
    results: dict[tuple[str, int], list[dict]] = {}
    load = os.getloadavg()[0]
    for r in range(a.rounds):
        order = servers if r % 2 == 0 else servers[::-1]
        for server in order:
            port = free_port()
            cmd, env = command(server, port)
            print(f"round {r + 1}: starting {server}", file=sys.stderr)
            srv = Server(cmd, env, work / f"{server}-{r}.log", port)
            try:
                for c in conc:
                    fn = f"{server}-{r}-c{c}.json"
                    bench = [str(vllm), "bench", "serve", "--backend", "openai", "--base-url", srv.url, "--model", name,
                             "--tokenizer", str(ckpt), "--dataset-name", "random", "--random-input-len", "256",
                             "--random-output-len", "128", "--ignore-eos", "--max-concurrency", str(c),
                             "--num-prompts", str(max(a.num_prompts, 2 * c)), "--seed", "0", "--save-result",
                             "--result-dir", str(work), "--result-filename", fn]
                    res = subprocess.run(bench, capture_output=True, text=True, env=dict(vllm_env, LD_PRELOAD=""))
                    if res.returncode != 0:
                        print(res.stdout[-2000:], res.stderr[-3000:], file=sys.stderr)
                        return 1
                    got = json.loads((work / fn).read_text())
                    results.setdefault((server, c), []).append({k: got.get(k) for k in METRICS})
                    print(f"  {server} C={c}: {got['output_throughput']:.1f} tok/s", file=sys.stderr)
            finally:
                srv.stop()
    best = {k: max(v, key=lambda m: m["output_throughput"]) for k, v in results.items()}
    lines = [f"`python scripts/bench_vllm_client.py {' '.join(argv if argv is not None else sys.argv[1:])}` — "
             f"{time.strftime('%Y-%m-%d %H:%M')}, {cpu_model()}, {os.cpu_count()} cores, load average {load:.2f} at "
             f"start; `vllm bench serve --backend openai`, random {256}→{128}, --ignore-eos; best of {a.rounds} "
             f"rounds (servers alternating); model {name} (vLLM: the same weights as a Hugging Face Llama "
             f"directory).", "",
             "| server | C | output tok/s | x ours | mean TTFT ms | mean TPOT ms | mean ITL ms | completed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for server in servers:
        for c in conc:
            m = best[(server, c)]
            ours = best[("ours", c)]["output_throughput"] if ("ours", c) in best else None
            ratio = f"{m['output_throughput'] / ours:.2f}" if ours else "–"
            lines.append(f"| {server} | {c} | {m['output_throughput']:.1f} | {ratio} | {m['mean_ttft_ms']:.1f} | "
                         f"{m['mean_tpot_ms']:.1f} | {m['mean_itl_ms']:.1f} | {m['completed']} |")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    (out.with_suffix(".json")).write_text(json.dumps({f"{s}/C={c}": v for (s, c), v in results.items()}, indent=1))
    print("\n".join(lines))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
