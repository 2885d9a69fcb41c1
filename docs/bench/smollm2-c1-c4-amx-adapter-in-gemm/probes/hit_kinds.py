"""Ad-hoc: RecGuide C=1 fused rounds by bet kind (continuation / correction), hits, and tokens per
round by the verified draft's origin (draft forward / prospective continuation / prospective correction)."""
import collections

from recguide_trt import LLM, SamplingParams
from recguide_trt.bench.workloads import load_prompts
from recguide_trt.runtime import executor as ex
from recguide_trt.runtime.plan import Kind

llm = LLM("smollm2-135m", compute_dtype="bfloat16", kv_cache_dtype="bfloat16")
E = ex.Executor
orig = E._decide_row
stats = collections.Counter()
tok = collections.defaultdict(list)
acc_by = collections.defaultdict(list)

def wrapped(self, b, w, r, out, greedy_c):
    origin = getattr(r.draft, "_origin", "draft") if r.draft is not None else None
    d = orig(self, b, w, r, out, greedy_c)
    if w.kind in (Kind.VERIFY, Kind.FUSED):
        tok[(origin, r.draft.block if hasattr(r.draft,'block') else w.block)].append(len(d.emitted))
        acc_by[origin].append(d.accepted)
    if w.kind is Kind.FUSED:
        cont = w.prospective.first_token == self.mask
        stats[("cont" if cont else "corr", bool(d.hit))] += 1
        if d.draft is not None:
            d.draft._origin = "pro-cont" if cont else "pro-corr"
    if w.kind is Kind.VERIFY:
        stats[("verify", None)] += 1
    return d

E._decide_row = wrapped
prompts = load_prompts("chat-code", 16, encode=llm.encode, max_prompt_tokens=320, render_chat=llm.chat_prompt)
for p in prompts:
    llm.generate([p], [SamplingParams(max_tokens=96, policy="recguide")])
print(sorted(stats.items(), key=str))
for k, v in sorted(tok.items(), key=str):
    print(k, len(v), sum(v) / len(v))
