#!/usr/bin/env python3
"""Talk to the RecGuide Triton model: HTTP ``generate_stream`` and gRPC streaming (tritonclient).

    scripts/serve_triton.sh --model path/to/ckpt &          # HTTP :8000, gRPC :8001
    python scripts/triton_client.py "def fibonacci(n):" --max-tokens 64 --policy recguide
    python scripts/triton_client.py "def f():" --protocol http

Needs ``tritonclient[grpc]`` (pip install 'recguide-trt[triton]'); the HTTP path uses only the
standard library (Server-Sent Events from /v2/models/recguide/generate_stream).
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import urllib.request

from recguide_trt.runtime.params import POLICIES


def http_generate_stream(url: str, prompt: str, max_tokens: int, policy: str, model: str = "recguide") -> dict:
    body = json.dumps({"text_input": prompt, "max_tokens": max_tokens, "policy": policy, "stream": True}).encode()
    req = urllib.request.Request(f"http://{url}/v2/models/{model}/generate_stream", data=body,
                                 headers={"Content-Type": "application/json"})
    last: dict = {}
    with urllib.request.urlopen(req) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise RuntimeError(event["error"])
            sys.stdout.write(event.get("text_output", ""))
            sys.stdout.flush()
            last = event
    return last


def grpc_stream(url: str, prompt: str, max_tokens: int, policy: str, model: str = "recguide") -> dict:
    import numpy as np
    import tritonclient.grpc as grpcclient

    def tensor(name, dtype, arr):
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        return t

    inputs = [tensor("text_input", "BYTES", np.array([prompt.encode()], dtype=np.object_)),
              tensor("max_tokens", "INT32", np.array([max_tokens], np.int32)),
              tensor("policy", "BYTES", np.array([policy.encode()], dtype=np.object_)),
              tensor("stream", "BOOL", np.array([True]))]
    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            result, error = q.get(timeout=600)
            if error is not None:
                raise RuntimeError(str(error))
            sys.stdout.write(result.as_numpy("text_output")[0].decode())
            sys.stdout.flush()
            if result.get_response().parameters["triton_final_response"].bool_param:
                return {name: result.as_numpy(name).tolist() for name in
                        ("output_token_ids", "draft_tokens", "accepted_draft_tokens", "forwards", "mal")}
    finally:
        client.stop_stream()
        client.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt")
    ap.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    ap.add_argument("--url", default=None, help="host:port (default 127.0.0.1:8001 gRPC / :8000 HTTP)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--policy", default="recguide", choices=POLICIES)
    args = ap.parse_args(argv)
    sys.stdout.write(args.prompt)
    try:
        if args.protocol == "http":
            stats = http_generate_stream(args.url or "127.0.0.1:8000", args.prompt, args.max_tokens, args.policy)
        else:
            stats = grpc_stream(args.url or "127.0.0.1:8001", args.prompt, args.max_tokens, args.policy)
    except (RuntimeError, OSError) as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write("\n")
    stats.pop("text_output", None)
    print(json.dumps(stats), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
