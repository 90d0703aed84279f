#!/usr/bin/env bash
# GPU check of the distributed runtime (see relibra/runtime/gpu_check.py). Needs one CUDA GPU;
# writes $OUT/gpu_check.json (OUT defaults to results/gpu_check). A few minutes at most.
set -euo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-results/gpu_check}"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python
timeout 480 "$PY" -m relibra.runtime.gpu_check
