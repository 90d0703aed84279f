#!/usr/bin/env bash
# The prepared check for a GPU machine (one H200 and 16 CPU cores); under 8 minutes. Nothing in the kit
# depends on it. Writes everything under $OUT/data/device/ (OUT defaults to the repository root, so the
# files land in data/device/ ready to commit):
#   (a) runtime_cuda_world1.json  the runtime (megatron-core GPTModel with ReLibra's MoE spec) on CUDA with
#                                 NCCL, world size 1, float64, with its equivalence check
#   (b) expert_gemm.json          expert GEMMs (bf16, forward + backward) at the expert shapes of
#                                 Qwen3-30B-A3B, GLM-4.5-Air and Qwen3-235B-A22B, 64..65536 tokens
#       <gpu>_preset.json         the cluster preset fitted from (b) (use it as --cluster <path>)
#   (c) cpu16_gloo_fit.json       micro-benchmarks of the 16-core host (the simulator's CPU preset there)
#       cpu_ep8.json              the CPU gloo runtime at EP8 (8 ranks, 1 thread each), megatron and relibra
#   device_check.log              everything printed
# Usage: bash scripts/device_check.sh [--dry-run]   (--dry-run: CPU-only smoke run of every part, tiny sizes)
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"; [ -x "$PY" ] || PY=python
TORCHRUN="$(dirname "$PY")/torchrun"; [ -x "$TORCHRUN" ] || TORCHRUN=torchrun
DEST="${OUT:-.}/data/device"; mkdir -p "$DEST"
LOG="$DEST/device_check.log"; : > "$LOG"
DRY=0; [ "${1:-}" = "--dry-run" ] && DRY=1
say() { echo "== $* ($(date -u +%H:%M:%S))" | tee -a "$LOG"; }
# A command's output goes to FILE.partial and is renamed to FILE only when the command succeeded.
land() { if [ "$1" = 0 ]; then mv "$2.partial" "$2"; else echo "$2.partial kept: exit $1" | tee -a "$LOG"; fi; }
export OMP_NUM_THREADS=1
start=$(date +%s)
$PY - <<'PY' 2>&1 | tee -a "$LOG"
import os, platform, torch
print("host:", platform.node(), "cpus:", len(os.sched_getaffinity(0)), "torch", torch.__version__,
      "gpu:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
PY

say "(a) runtime on CUDA, world size 1, equivalence check"
if [ $DRY = 1 ]; then A_SIZE=(--model tiny --tokens-per-rank 16 --micro-batches 1 --steps 1 --warmup-steps 0)
else A_SIZE=(--model moe-cpu --tokens-per-rank 2048 --micro-batches 2 --steps 3 --warmup-steps 1); fi
timeout 150 "$TORCHRUN" --standalone --nproc-per-node 1 -m relibra run --torchrun "${A_SIZE[@]}" \
    --policies megatron,relibra --check-equivalence --json > "$DEST/runtime_cuda_world1.json.partial" 2>> "$LOG"
rc=$?; echo "(a) exit $rc" | tee -a "$LOG"; land $rc "$DEST/runtime_cuda_world1.json"

say "(b) expert GEMMs"
if [ $DRY = 1 ]; then
  timeout 120 $PY -m relibra.bench.device gemm --out "$DEST" --dry-run 2>&1 | tee -a "$LOG"
else
  timeout 180 $PY -m relibra.bench.device gemm --out "$DEST" 2>&1 | tee -a "$LOG"
  GPU=$($PY -c "import json; print(json.load(open('$DEST/expert_gemm.json'))['device'].lower().replace('nvidia ','').split()[0])")
  $PY -m relibra.bench.device preset --gemm "$DEST/expert_gemm.json" --shape qwen3-30b-a3b \
      --out "$DEST/${GPU}_preset.json" 2>&1 | tee -a "$LOG"
fi

say "(c) CPU gloo runtime at EP8, 8 ranks x 1 thread (CUDA hidden)"
if [ $DRY = 1 ]; then C_RANKS=2; C_SIZE=(--model tiny --tokens-per-rank 16 --micro-batches 1 --steps 1 --warmup-steps 0)
else C_RANKS=8; C_SIZE=(--model moe-cpu --tokens-per-rank 1024 --micro-batches 2 --steps 20 --warmup-steps 2); fi
CUDA_VISIBLE_DEVICES="" timeout 120 $PY -m relibra calibrate --model moe-cpu --world $C_RANKS \
    $([ $DRY = 1 ] && echo --quick --repeats 2) --out "$DEST/cpu16_gloo_fit.json" >> "$LOG" 2>&1
echo "calibrate exit $?" | tee -a "$LOG"
CUDA_VISIBLE_DEVICES="" RELIBRA_CPU_FIT="$DEST/cpu16_gloo_fit.json" timeout 240 $PY -m relibra run \
    --nproc $C_RANKS --nodes 1 "${C_SIZE[@]}" --policies megatron,relibra --json > "$DEST/cpu_ep8.json.partial" 2>> "$LOG"
rc=$?; echo "(c) exit $rc" | tee -a "$LOG"; land $rc "$DEST/cpu_ep8.json"
say "done in $(( $(date +%s) - start )) s"
