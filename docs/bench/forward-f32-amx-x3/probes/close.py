# float32 logits: the FMA path (RECGUIDE_NATIVE_X3 unset) against AMX x3, same source; and a reference in float64 torch?
import os, sys, numpy as np, torch
from recguide_trt.backends.native_backend import NativeBackend
from recguide_trt.bench.forward_cost import fill_past, draft_batch, verify_batch
from recguide_trt.model.checkpoint import load_checkpoint
from recguide_trt.models import resolve_model
torch.set_num_threads(2)
model = load_checkpoint(resolve_model("smollm2-135m"), dtype="float32", load_adapter=True).model
cfg = model.config
os.environ.pop("RECGUIDE_NATIVE_X3", None)
a = NativeBackend(model, 64, 200)
os.environ["RECGUIDE_NATIVE_X3"] = "1"
b = NativeBackend(model, 64, 200)
os.environ.pop("RECGUIDE_NATIVE_X3", None)
bf = NativeBackend(model, 64, 200, compute_dtype="bfloat16")
for be in (a, b, bf): fill_past(be, 64, 60)
for rows, tok in ((1, 1), (1, 8), (8, 1), (64, 1), (3, 16)):
    batch = verify_batch(rows, tok, 60)
    batch.want_logits[:] = True
    oa, ob, oc = (be.forward(batch) for be in (a, b, bf))
    d = np.abs(oa.logits - ob.logits).max(); dc = np.abs(oa.logits - oc.logits).max()
    print(rows, tok, "fma vs x3 max|d|", d, "argmax eq", np.mean(oa.argmax == ob.argmax), " | fma vs bf16", dc, np.mean(oa.argmax == oc.argmax))
