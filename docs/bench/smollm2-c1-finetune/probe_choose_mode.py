"""Ad-hoc probe: RecGuide's mode and switch point, step by step, for a fresh policy at C = 1 (6 held-out
prompts one at a time, bf16 compute + KV). The README's "first ~125 steps in the adaptive mode" (Xeon,
2026-12-05: adaptive with switch 0 from step 1, overlap with switch 2 from step 126)."""
from recguide_trt import LLM, SamplingParams
from recguide_trt.bench.workloads import load_prompts

llm = LLM("smollm2-135m", compute_dtype="bfloat16", kv_cache_dtype="bfloat16")
pol = llm.engine.policies["recguide"]
orig = pol.choose_mode
log = []


def wrapped(concurrency, step):
    mode = orig(concurrency, step)
    log.append((step, concurrency, mode, pol._switch))
    return mode


pol.choose_mode = wrapped
prompts = load_prompts("chat-code", 6, encode=llm.encode, max_prompt_tokens=320, render_chat=llm.chat_prompt)
for p in prompts:
    llm.generate([p], [SamplingParams(max_tokens=96, policy="recguide")])
prev = None
for step, conc, mode, switch in log:
    if (mode, switch) != prev:
        print("step", step, "concurrency", conc, "mode", mode, "switch", switch)
        prev = (mode, switch)
print("steps", len(log), "adaptive", sum(1 for x in log if x[2] == "adaptive"))
