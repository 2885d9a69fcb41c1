"""Ad-hoc: for each RecGuide C=1 verified round (fused or plain), which of the top-3 likely outcomes it matched."""
import collections

from recguide_trt import LLM, SamplingParams
from recguide_trt.bench.workloads import load_prompts
from recguide_trt.runtime import executor as ex
from recguide_trt.runtime.mismatch import likely_outcomes
from recguide_trt.runtime.plan import Kind

llm = LLM("smollm2-135m", compute_dtype="bfloat16", kv_cache_dtype="bfloat16")
E = ex.Executor
o_flag, o_new, o_dec = E._flag, E._new_draft, E._decide_row


def flag(self, top_ids, top_probs, drafted, first):
    self._last = likely_outcomes(top_ids, top_probs, self.eos, 3, drafted, first=first)
    return o_flag(self, top_ids, top_probs, drafted, first)


def new(self, *a, **k):
    d = o_new(self, *a, **k)
    d._top = self._last
    return d


rank = collections.Counter()
kinds = collections.Counter()


def dec(self, b, w, r, out, greedy_c):
    draft = r.draft
    d = o_dec(self, b, w, r, out, greedy_c)
    if w.kind in (Kind.VERIFY, Kind.FUSED) and len(draft.tokens) == 3:
        k, c, nxt = len(draft.tokens), d.accepted, d.emitted[-1]
        got = None
        for i, m in enumerate(draft._top):
            if (m.position < 0 and c == k) or (m.position > 0 and c == m.position - 1 and nxt == m.correction):
                got = i
                break
        rank[got] += 1
        kinds[(w.kind.value, "cont" if draft._top[0].position < 0 else "corr", got)] += 1
    return d


E._flag, E._new_draft, E._decide_row = flag, new, dec
prompts = load_prompts("chat-code", 16, encode=llm.encode, max_prompt_tokens=320, render_chat=llm.chat_prompt)
for p in prompts:
    llm.generate([p], [SamplingParams(max_tokens=96, policy="recguide")])
n = sum(rank.values())
print("L4 rounds", n, {k: round(v / n, 3) for k, v in rank.items()})
for k, v in sorted(kinds.items(), key=str):
    print(k, v)
