"""Ad-hoc probe (2026-12-06, the Xeon): at each re-derivation of RecGuide's switch point in a C = 1 run, the
hit-rate estimates (pooled and per block) and each mode's rated tokens per AR-step of time (8 held-out prompts)."""
from recguide_trt import LLM, SamplingParams
from recguide_trt.bench.workloads import load_prompts

llm = LLM("smollm2-135m", compute_dtype="bfloat16", kv_cache_dtype="bfloat16")
pol = llm.engine.policies["recguide"]
orig = pol.derived_switch
step = [0]
oc = pol.choose_mode
def cm(c, s):
    step[0] = s
    return oc(c, s)
pol.choose_mode = cm
def ds():
    sw = orig()
    pooled = pol.acceptance.no_history
    vals = {}
    for ov in (True, False):
        for L in (2, 4, 8):
            vals[(ov, L)] = round(pol.step_value(pooled, L, ov) / pol.step_time(1, L, ov) * pol.step_time(1, 1, False), 3)
    print("step", step[0], "switch", sw, "hit", round(pol.hit_rate, 3), {L: round(pol.block_hit_rate(L), 3) for L in (2, 4, 8)},
          "obs", pol.prospective + pol.counterfactual, "exp4", round(pol.acceptance.expected_tokens(pooled, 4), 2), vals)
    return sw
pol.derived_switch = ds
prompts = load_prompts("chat-code", 8, encode=llm.encode, max_prompt_tokens=320, render_chat=llm.chat_prompt)
for p in prompts:
    llm.generate([p], [SamplingParams(max_tokens=96, policy="recguide")])
