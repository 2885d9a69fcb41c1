"""Ad-hoc probe (2026-12-06, the Xeon, before the load-averaged switch): after 8 held-out prompts at C = 1, the
derived switch point, hit-rate and acceptance estimates, and each mode's rated tokens per AR-step of time at C = 1-8."""
from recguide_trt import LLM, SamplingParams
from recguide_trt.bench.workloads import load_prompts

llm = LLM("smollm2-135m", compute_dtype="bfloat16", kv_cache_dtype="bfloat16")
pol = llm.engine.policies["recguide"]
prompts = load_prompts("chat-code", 8, encode=llm.encode, max_prompt_tokens=320, render_chat=llm.chat_prompt)
for p in prompts:
    llm.generate([p], [SamplingParams(max_tokens=96, policy="recguide")])
pooled = pol.acceptance.no_history
print("switch", pol.derived_switch(), "hit", {L: round(pol.block_hit_rate(L), 3) for L in (2, 4, 8)},
      "exp", {L: round(pol.acceptance.expected_tokens(pooled, L), 2) for L in (2, 4, 8)})
for c in (1, 2, 4, 8):
    ar = pol.step_time(c, 1, False)
    row = {}
    for ov in (True, False):
        for L in (2, 4, 8):
            row[("ov" if ov else "pl", L)] = round(pol.step_value(pooled, L, ov) / pol.step_time(c, L, ov) * ar, 3)
    print("C", c, row)
