"""float32 logits of the FMA path against the AMX x3 path (RECGUIDE_NATIVE_X3=1 at pack time, with a patch
from the folder above applied) and against bf16 compute, at a past of 60 tokens."""

import os

import numpy as np
import torch

from recguide_trt.backends.native_backend import NativeBackend
from recguide_trt.bench.forward_cost import fill_past, verify_batch
from recguide_trt.model.checkpoint import load_checkpoint
from recguide_trt.models import resolve_model

torch.set_num_threads(2)
model = load_checkpoint(resolve_model("smollm2-135m"), dtype="float32", load_adapter=True).model
os.environ.pop("RECGUIDE_NATIVE_X3", None)
fma = NativeBackend(model, 64, 200)
os.environ["RECGUIDE_NATIVE_X3"] = "1"
x3 = NativeBackend(model, 64, 200)
os.environ.pop("RECGUIDE_NATIVE_X3", None)
bf16 = NativeBackend(model, 64, 200, compute_dtype="bfloat16")
for be in (fma, x3, bf16):
    fill_past(be, 64, 60)
for rows, tokens in ((1, 1), (1, 8), (8, 1), (64, 1), (3, 16)):
    batch = verify_batch(rows, tokens, 60)
    batch.want_logits[:] = True
    a, b, c = (be.forward(batch) for be in (fma, x3, bf16))
    print(rows, tokens,
          "fma vs x3 max|d|", np.abs(a.logits - b.logits).max(), "argmax eq", np.mean(a.argmax == b.argmax),
          " | fma vs bf16", np.abs(a.logits - c.logits).max(), np.mean(a.argmax == c.argmax))
