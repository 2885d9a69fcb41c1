#!/usr/bin/env bash
# nsys timeline of a short RecGuide workload on a GPU machine. The runtime's NVTX ranges (domain
# "RecGuide": schedule, draft, verify, fused, accept, calibrate) appear next to the CUDA kernels.
# Without nsys, `recguide profile` writes a Chrome/Perfetto trace with the same ranges.
#   bash scripts/profile_nsys.sh [recguide profile options, e.g. --policy recguide --requests 16]
set -euo pipefail
if ! command -v nsys >/dev/null 2>&1; then
  echo "profile_nsys.sh: nsys not found; install NVIDIA Nsight Systems, or run 'recguide profile' for a Chrome trace" >&2
  exit 1
fi
OUT=${OUT:-recguide_nsys}
nsys profile -t cuda,nvtx,osrt -o "$OUT" --force-overwrite true \
  recguide profile --device cuda --out "${OUT}_ranges.json" "$@"
echo "wrote ${OUT}.nsys-rep (open in Nsight Systems) and ${OUT}_ranges.json"
