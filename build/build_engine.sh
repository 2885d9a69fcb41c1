#!/usr/bin/env bash
# Build a TensorRT engine for RecGuide-TRT.
#
#   build/build_engine.sh --onnx-dir DIR [--name NAME] [--precision fp16|bf16|fp32] [--plugin-lib PATH]
#                         [--timing-cache PATH] [--workspace-gb N] [--tau T]
#   build/build_engine.sh --model CHECKPOINT [--export-dir DIR] [build options...]
#
# With --model the checkpoint is first exported to ONNX (`recguide export`, into --export-dir or
# build/engines/_onnx/<checkpoint name>, git-ignored) and the engine is built from that export. Engines go to
# build/engines/<name>/ (git-ignored); settings default to build/configs/default.json.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
PYTHON="${PYTHON:-${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}}"
PYTHON="${PYTHON:-python}"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    PYTHON=python3
fi

model=""
export_dir=""
args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) model="${2:?--model needs a checkpoint directory}"; shift 2 ;;
        --model=*) model="${1#*=}"; shift ;;
        --export-dir) export_dir="${2:?--export-dir needs a directory}"; shift 2 ;;
        --export-dir=*) export_dir="${1#*=}"; shift ;;
        -h|--help)
            sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            echo
            exec "$PYTHON" -m recguide_trt.engine.build --help ;;
        *) args+=("$1"); shift ;;
    esac
done

cd "$ROOT"
if [[ -n "$model" ]]; then
    if [[ ! -f "$model/config.json" ]]; then
        echo "error: --model $model is not a checkpoint directory (no config.json)" >&2
        exit 1
    fi
    export_dir="${export_dir:-$ROOT/build/engines/_onnx/$(basename "$(cd "$model" && pwd)")}"
    echo "exporting $model -> $export_dir" >&2
    "$PYTHON" -m recguide_trt.cli export --model "$model" --out "$export_dir"
    args=(--onnx-dir "$export_dir" "${args[@]}")
fi
exec "$PYTHON" -m recguide_trt.engine.build "${args[@]}"
