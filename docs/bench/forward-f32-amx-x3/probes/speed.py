"""Forward time by shape, the FMA path against AMX x3 (RECGUIDE_NATIVE_X3=1 at pack time, with a patch from
the folder above applied) and bf16 compute, interleaved in one process (order alternating per repeat); past 256,
best of REPS. Usage: python speed.py [REPS]."""

import os
import sys
import time

import torch

from recguide_trt.backends.native_backend import NativeBackend
from recguide_trt.bench.forward_cost import fill_past, verify_batch
from recguide_trt.model.checkpoint import load_checkpoint
from recguide_trt.models import resolve_model

torch.set_num_threads(2)
model = load_checkpoint(resolve_model("smollm2-135m"), dtype="float32", load_adapter=True).model
os.environ.pop("RECGUIDE_NATIVE_X3", None)
backends = {"fma": NativeBackend(model, 64, 600)}
os.environ["RECGUIDE_NATIVE_X3"] = "1"
backends["x3"] = NativeBackend(model, 64, 600)
os.environ.pop("RECGUIDE_NATIVE_X3", None)
backends["bf16"] = NativeBackend(model, 64, 600, compute_dtype="bfloat16")
shapes = [(1, 1), (1, 8), (1, 16), (8, 1), (64, 1)]
for be in backends.values():
    fill_past(be, 64, 256)
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
times = {(k, s): [] for k in backends for s in shapes}
for r in range(reps):
    for s in shapes:
        batch = verify_batch(s[0], s[1], 256)
        order = list(backends.items()) if r % 2 == 0 else list(reversed(backends.items()))
        for k, be in order:
            t0 = time.perf_counter()
            be.forward(batch)
            times[(k, s)].append(time.perf_counter() - t0)
best = {key: min(v) for key, v in times.items()}
for s in shapes:
    cells = "  ".join(f"{k} {1e3 * best[(k, s)]:.2f} ms ({best[(k, s)] / best[(k, (1, 1))]:.2f}x)" for k in backends)
    print(s, cells, f"  fma/x3 {best[('fma', s)] / best[('x3', s)]:.2f}")
