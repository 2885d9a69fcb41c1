#!/usr/bin/env bash
# Generate a RecGuide model repository and serve it with Triton Inference Server on 127.0.0.1
# (BIND_ADDRESS overrides; RECGUIDE_MODEL / RECGUIDE_BACKEND give --model / --backend defaults).
#
default]|default] [--backend torch] [--out DIR] [--http-port 8000]
#                           [--grpc-port 8001] [--metrics-port 8002] [-- extra triton-repo args]
#
# PYTHON (default: the project's .venv if present, else python3 on PATH) is the serving environment: it needs recguide_trt, numpy<2
# (Triton's python-backend stub misreads numpy 2 arrays) and, without a system tritonserver,
# nvidia-pytriton, whose wheel bundles a tritonserver binary:
#   python -m venv /opt/venv-triton && /opt/venv-triton/bin/pip install -e '.[triton]' -c constraints.txt
#   PYTHON=/opt/venv-triton/bin/python scripts/serve_triton.sh --model path/to/ckpt
#
# Environment the server gets (the same as recguide_trt.serving.triton_repo.TritonServer):
#   PATH             the serving env's bin/ first: the python-backend stub runs the first `python3`
#                    on PATH, and that interpreter must be the one with numpy<2 and recguide_trt.
#   LD_LIBRARY_PATH  + the interpreter's sysconfig LIBDIR (libpython3.X.so for the stub) and, for
#                    the pytriton-bundled server, the wheel's nvidia_pytriton.libs directory.
# With a system tritonserver (on PATH or /opt/tritonserver, e.g. the NGC container) its own
# backends are used; with the pytriton one, a backend directory with the python backend and the
# stub for this Python version is linked into OUT/triton-backends.
set -euo pipefail

# The project's venv when there is one (the README's install command makes .venv), else python3.
_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${PYTHON:-}" ] && [ -x "$_ROOT/.venv/bin/python" ]; then PYTHON="$_ROOT/.venv/bin/python"; fi
PYTHON=${PYTHON:-python3}
MODEL=${RECGUIDE_MODEL:-default}
BACKEND=${RECGUIDE_BACKEND:-torch}
OUT=${OUT:-./triton-repo}
ADDRESS=${BIND_ADDRESS:-127.0.0.1}   # loopback unless asked (the container sets 0.0.0.0)
HTTP_PORT=8000
GRPC_PORT=8001
METRICS_PORT=8002
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --backend) BACKEND=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --http-port) HTTP_PORT=$2; shift 2 ;;
    --grpc-port) GRPC_PORT=$2; shift 2 ;;
    --metrics-port) METRICS_PORT=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

PYTHON=$(command -v "$PYTHON")
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
"$PYTHON" - <<'PY'
import sys
import numpy
if int(numpy.__version__.split(".")[0]) >= 2:
    sys.exit(f"{sys.prefix} has numpy {numpy.__version__}; Triton's python backend needs numpy<2 "
             f"(pip install 'numpy<2' there, or set PYTHON to another environment)")
PY

"$PYTHON" -m recguide_trt.serving.triton_repo --model "$MODEL" --backend "$BACKEND" --out "$OUT/repo" "${EXTRA[@]}"

BIN_DIR=$(dirname "$PYTHON")
LIBDIR=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')
export PATH="$BIN_DIR:$PATH"
export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

ARGS=(--model-repository="$OUT/repo" --http-address="$ADDRESS" --http-port="$HTTP_PORT"
      --grpc-address="$ADDRESS" --grpc-port="$GRPC_PORT" --metrics-address="$ADDRESS"
      --metrics-port="$METRICS_PORT")
if command -v tritonserver >/dev/null 2>&1; then
  TRITONSERVER=$(command -v tritonserver)
elif [[ -x /opt/tritonserver/bin/tritonserver ]]; then
  TRITONSERVER=/opt/tritonserver/bin/tritonserver
else
  DIST=$("$PYTHON" -c 'import os, pytriton; print(os.path.join(os.path.dirname(pytriton.__file__), "tritonserver"))') || {
    echo "no tritonserver on PATH and nvidia-pytriton is not installed for $PYTHON" >&2; exit 1; }
  PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  TRITONSERVER="$DIST/bin/tritonserver"
  mkdir -p "$OUT/triton-backends/python"
  ln -sf "$DIST"/backends/python/* "$OUT/triton-backends/python/"
  ln -sf "$DIST/python_backend_stubs/$PYVER/triton_python_backend_stub" "$OUT/triton-backends/python/"
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$DIST")/../nvidia_pytriton.libs"
  ARGS+=(--backend-directory="$OUT/triton-backends")
fi
echo "starting $TRITONSERVER (HTTP $ADDRESS:$HTTP_PORT, gRPC $ADDRESS:$GRPC_PORT)" >&2
exec "$TRITONSERVER" "${ARGS[@]}"
