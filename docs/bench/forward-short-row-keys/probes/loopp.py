"""Loop prompt prefills (PROMPTS x TOKENS, bf16 compute + KV) for a while, then print the phase timers.

Usage: ``[SRC=<nld_cpu.cpp>] python loopp.py PROMPTS TOKENS SECONDS``.
"""

import os
import sys
import time

import torch

from recguide_trt.backends.native_backend import NativeBackend
from recguide_trt.bench.forward_cost import verify_batch
from recguide_trt.model.checkpoint import load_checkpoint
from recguide_trt.models import resolve_model

torch.set_num_threads(2)
rows, toks, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
model = load_checkpoint(resolve_model("smollm2-135m"), dtype="float32", load_adapter=False).model
src = {"source": os.environ["SRC"]} if "SRC" in os.environ else {}
be = NativeBackend(model, rows, toks + 32, compute_dtype="bfloat16", kv_cache_dtype="bfloat16", **src)
b = verify_batch(rows, toks, 0, prefill=True)
t_end, n = time.time() + secs, 0
while time.time() < t_end:
    be.forward(b)
    n += 1
be.set_timing(True)
be.forward(b)
print({k: round(v * 1e3, 2) for k, v in be.timings().items()}, n)
