"""The all-AR packing shortcut builds exactly the batch of the general packer."""

from __future__ import annotations

import numpy as np

from recguide_trt.runtime.executor import Executor
from recguide_trt.runtime.params import SamplingParams
from recguide_trt.runtime.plan import Kind, Work
from recguide_trt.runtime.request import Request


def test_all_ar_shortcut_equals_general_pack():
    rng = np.random.default_rng(0)
    reqs = []
    for i in range(7):
        r = Request(i, [5, 6, 7], SamplingParams(temperature=0.7 if i == 3 else 0.0), np.random.default_rng(i))
        r.slot, r.cache_len, r.seed = int(rng.integers(0, 9)), int(rng.integers(3, 90)), int(rng.integers(4, 90))
        reqs.append(r)
    works = [Work(r.id, Kind.AR) for r in reqs]
    ex = Executor(None, mask_token_id=3, eos_token_id=2, tau=0.5)
    fast, slow = ex.pack(works, reqs), ex._pack_rows(works, reqs)
    for field in ("slots", "past_lens", "input_ids", "position_ids", "intra_mask", "draft_gate", "want_logits",
                  "row_lens"):
        a, b = getattr(fast, field), getattr(slow, field)
        assert a.dtype == b.dtype and np.array_equal(a, b), field
    assert fast.last_only == slow.last_only is False
