"""Phase timers of two kernels side by side: decode forwards of each row count, interleaved, best of reps.

Usage: ``python phab.py PAST ROWS,ROWS,... BEFORE_CPP [REPS]`` ("now" is the package's kernel).
"""

import sys
import time

import torch

from recguide_trt.backends.native_backend import NativeBackend
from recguide_trt.bench.forward_cost import fill_past, verify_batch
from recguide_trt.model.checkpoint import load_checkpoint
from recguide_trt.models import resolve_model

torch.set_num_threads(2)
past, before = int(sys.argv[1]), sys.argv[3]
rows_list = [int(x) for x in sys.argv[2].split(",")]
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 15
model = load_checkpoint(resolve_model("smollm2-135m"), dtype="float32", load_adapter=False).model
R = max(rows_list)
opts = {"compute_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"}
bes = {"now": NativeBackend(model, R, past + 32, **opts),
       "before": NativeBackend(model, R, past + 32, source=before, **opts)}
for be in bes.values():
    fill_past(be, R, past)
best = {}
for rep in range(reps):
    for rows in rows_list:
        b = verify_batch(rows, 1, past)
        for name, be in (list(bes.items()) if rep % 2 == 0 else list(bes.items())[::-1]):
            time.sleep(0.003)
            be.set_timing(True)
            t0 = time.perf_counter()
            be.forward(b)
            t = time.perf_counter() - t0
            tm = be.timings()
            be.set_timing(False)
            if (name, rows) not in best or t < best[(name, rows)][0]:
                best[(name, rows)] = (t, tm)
for rows in rows_list:
    for name in bes:
        t, tm = best[(name, rows)]
        phases = " ".join(f"{k}={v * 1e3:.2f}" for k, v in tm.items() if v > 0)
        print(f"{name:7s} rows {rows:3d}: total {t * 1e3:6.2f}  {phases}")
