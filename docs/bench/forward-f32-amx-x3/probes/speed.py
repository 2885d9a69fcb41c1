import os, sys, time, numpy as np, torch
from recguide_trt.backends.native_backend import NativeBackend
from recguide_trt.bench.forward_cost import fill_past, verify_batch
from recguide_trt.model.checkpoint import load_checkpoint
from recguide_trt.models import resolve_model
torch.set_num_threads(2)
model = load_checkpoint(resolve_model("smollm2-135m"), dtype="float32", load_adapter=True).model
os.environ.pop("RECGUIDE_NATIVE_X3", None)
bes = {"fma": NativeBackend(model, 64, 600)}
os.environ["RECGUIDE_NATIVE_X3"] = "1"
bes["x3"] = NativeBackend(model, 64, 600)
os.environ.pop("RECGUIDE_NATIVE_X3", None)
bes["bf16"] = NativeBackend(model, 64, 600, compute_dtype="bfloat16")
shapes = [(1, 1), (1, 8), (1, 16), (8, 1), (64, 1)]
for be in bes.values(): fill_past(be, 64, 256)
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
t = {(k, s): [] for k in bes for s in shapes}
for r in range(reps):
    for s in shapes:
        batch = verify_batch(s[0], s[1], 256)
        for k, be in (bes.items() if r % 2 == 0 else reversed(list(bes.items()))):
            t0 = time.perf_counter(); be.forward(batch); t[(k, s)].append(time.perf_counter() - t0)
base = {k: np.min(t[(k, (1, 1))]) for k in bes}
for s in shapes:
    print(s, "  ".join(f"{k} {1e3*np.min(t[(k, s)]):.2f} ms ({np.min(t[(k, s)])/base[k]:.2f}x)" for k in bes),
          f"  fma/x3 {np.min(t[('fma', s)])/np.min(t[('x3', s)]):.2f}")
batch = verify_batch(3, 16, 256); batch.want_logits[:] = True
np.save(f"/tmp/x3/logits_v{os.environ.get('RECGUIDE_NATIVE_X3V','1')}.npy", bes["x3"].forward(batch).logits)
