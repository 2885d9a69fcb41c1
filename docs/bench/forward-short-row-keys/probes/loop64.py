"""Loop N-row decode forwards (bf16 compute + KV) for a while, then print the phase timers once.

Run under ``perf record -a``, or with SRC=<an instrumented nld_cpu.cpp> (``instrument.py``) to print
its per-item cycle counters. Usage: ``ROWS=64 [SRC=...] python loop64.py PAST SECONDS``.
"""

import os
import sys
import time

import torch

from recguide_trt.backends.native_backend import NativeBackend
from recguide_trt.bench.forward_cost import fill_past, verify_batch
from recguide_trt.model.checkpoint import load_checkpoint
from recguide_trt.models import resolve_model

th = int(os.environ.get("TH", "2"))
torch.set_num_threads(th)
past, secs, rows = int(sys.argv[1]), float(sys.argv[2]), int(os.environ.get("ROWS", "64"))
model = load_checkpoint(resolve_model("smollm2-135m"), dtype="float32", load_adapter=False).model
src = {"source": os.environ["SRC"]} if "SRC" in os.environ else {}
be = NativeBackend(model, rows, past + 32, compute_dtype="bfloat16", kv_cache_dtype="bfloat16", **src)
fill_past(be, rows, past)
b = verify_batch(rows, int(os.environ.get("TOK", "1")), past)
for _ in range(3):
    be.forward(b)
t_end, n, best = time.time() + secs, 0, 1e9
while time.time() < t_end:
    t0 = time.perf_counter()
    be.forward(b)
    best = min(best, time.perf_counter() - t0)
    n += 1
be.set_timing(True)
be.forward(b)
print({k: round(v * 1e3, 2) for k, v in be.timings().items()})
print(f"past {past} rows {rows} threads {th}: {n} forwards, best {best * 1e3:.2f} ms")
