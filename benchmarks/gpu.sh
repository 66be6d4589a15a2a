#!/bin/bash
# The GPU proof in one command, on one H100/H200 with that machine's own JAX (no install):
#   bash benchmarks/gpu.sh [OUT]        # about 9 minutes; writes OUT/gpu.json and OUT/gpu.md (default gpu-bench)
# Only this checkout is needed: it is put on PYTHONPATH (src/ for jaxtrain, the root for benchmarks/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$ROOT/src:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$ROOT"
exec "${PYTHON:-python3}" -m jaxtrain bench gpu --out "${1:-gpu-bench}" "${@:2}"
