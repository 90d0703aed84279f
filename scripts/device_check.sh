#!/usr/bin/env bash
# The prepared check for a lent GPU machine (one or more GPUs, 16 CPU cores); about 5 minutes on one GPU.
# Nothing in the kit depends on it. Writes everything under $OUT/data/device/ (OUT defaults to the
# repository root, so the files land in data/device/ ready to commit):
#   (1) gpu_checks.json          scripts/device_check.py over every GPU (torchrun, process group
#                                "cpu:gloo,cuda:nccl"), each check passed / failed / not checked and why:
#         ddp         megatron DDP + get_megatron_optimizer, ReLibra against static placement: float64 (Adam)
#                     and bfloat16 with the distributed optimizer (bounds of tests/test_megatron_ddp.py)
#         replicas    replica slots carried tokens, experts migrated between GPUs      (two or more GPUs)
#         ep_nccl     EP over NCCL with the equivalence check                           (two or more GPUs)
#         te_grouped  Transformer Engine's GroupedLinear layout and bf16 numerics        (where TE imports)
#   (2) runtime_cuda.json        the runtime (megatron-core GPTModel, ReLibra's MoE spec) on CUDA, one rank
#                                per GPU, float64, with its equivalence check
#   (3) expert_gemm.json         bf16 expert GEMMs (forward + backward) at the expert shapes of
#                                Qwen3-30B-A3B, GLM-4.5-Air and Qwen3-235B-A22B, 64..65536 tokens
#       <gpu>_preset.json        the cluster preset fitted from (3) (use it as --cluster <path>)
#   (4) cpu16_gloo_fit.json, cpu_ep8.json   with --cpu-fit only: the simulator's CPU preset fitted on the
#                                host and the CPU gloo runtime at EP 8 (data/README.md)
#   device_check.log             everything printed, ending with what could not be checked here
# Usage: bash scripts/device_check.sh [--dry-run] [--cpu-fit]   (--dry-run: no GPU needed; (1) and (2) on the
#        host with gloo, 2 ranks, tiny sizes; (3) its dry run)
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"; [ -x "$PY" ] || PY=python3
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DEST="${OUT:-.}/data/device"; mkdir -p "$DEST"
LOG="$DEST/device_check.log"; : > "$LOG"
DRY=0; CPU_FIT=0
for arg in "$@"; do case $arg in --dry-run) DRY=1;; --cpu-fit) CPU_FIT=1;;
  *) echo "error: unknown argument $arg (takes --dry-run, --cpu-fit)" >&2; exit 2;; esac; done
say() { echo "== $* ($(date -u +%H:%M:%S))" | tee -a "$LOG"; }
# A command's output goes to FILE.partial and is renamed to FILE only when the command succeeded.
land() { if [ "$1" = 0 ]; then mv "$2.partial" "$2"; else echo "$2.partial kept: exit $1" | tee -a "$LOG"; fi; }
export OMP_NUM_THREADS=1
start=$(date +%s)
GPUS=$($PY -c "import torch; print(torch.cuda.device_count())" 2>>"$LOG") || GPUS=0
$PY - <<'PY' 2>&1 | tee -a "$LOG"
import os, platform, torch
print("host:", platform.node(), "cpus:", len(os.sched_getaffinity(0)), "torch", torch.__version__,
      "gpus:", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] or "none")
try:
    from megatron.core import package_info
    print("megatron-core", package_info.__version__)
except Exception as exc:
    print("megatron-core does not import:", exc)
PY
RANKS=$GPUS
if [ "$GPUS" = 0 ]; then
  if [ $DRY = 0 ]; then echo "no GPU on this machine: run with --dry-run for the host rehearsal" | tee -a "$LOG"; exit 1; fi
  RANKS=2
fi

say "(1) GPU checks on $RANKS rank(s): DDP + distributed optimizer (float64, bf16), replicas, migration, EP over NCCL, TE"
timeout 300 $PY -m torch.distributed.run --standalone --nproc-per-node "$RANKS" scripts/device_check.py \
    "$DEST/gpu_checks.json" 2>&1 | tee -a "$LOG"
echo "(1) exit ${PIPESTATUS[0]}" | tee -a "$LOG"

say "(2) runtime on CUDA, $RANKS rank(s), equivalence check"
if [ $DRY = 1 ]; then A_SIZE=(--model tiny --tokens-per-rank 16 --micro-batches 1 --steps 1 --warmup-steps 0)
else A_SIZE=(--model moe-cpu --tokens-per-rank 2048 --micro-batches 2 --steps 3 --warmup-steps 1); fi
timeout 150 $PY -m relibra.runtime.torchrun --standalone --nproc-per-node "$RANKS" -m relibra run --torchrun \
    "${A_SIZE[@]}" --policies megatron,relibra --check-equivalence --json > "$DEST/runtime_cuda.json.partial" 2>> "$LOG"
rc=$?; echo "(2) exit $rc" | tee -a "$LOG"; land $rc "$DEST/runtime_cuda.json"

say "(3) bf16 expert GEMMs"
if [ $DRY = 1 ]; then
  timeout 120 $PY -m relibra.bench.device gemm --out "$DEST" --dry-run 2>&1 | tee -a "$LOG"
else
  timeout 180 $PY -m relibra.bench.device gemm --out "$DEST" 2>&1 | tee -a "$LOG"
  GPU=$($PY -c "import json; print(json.load(open('$DEST/expert_gemm.json'))['device'].lower().replace('nvidia ','').split()[0])")
  $PY -m relibra.bench.device preset --gemm "$DEST/expert_gemm.json" --shape qwen3-30b-a3b \
      --out "$DEST/${GPU}_preset.json" 2>&1 | tee -a "$LOG"
fi

if [ $CPU_FIT = 1 ]; then
  say "(4) CPU gloo runtime at EP8, 8 ranks x 1 thread (CUDA hidden)"
  if [ $DRY = 1 ]; then C_RANKS=2; C_SIZE=(--model tiny --tokens-per-rank 16 --micro-batches 1 --steps 1 --warmup-steps 0)
  else C_RANKS=8; C_SIZE=(--model moe-cpu --tokens-per-rank 1024 --micro-batches 2 --steps 20 --warmup-steps 2); fi
  CUDA_VISIBLE_DEVICES="" timeout 120 $PY -m relibra calibrate --model moe-cpu --world $C_RANKS \
      $([ $DRY = 1 ] && echo --quick --repeats 2) --out "$DEST/cpu16_gloo_fit.json" >> "$LOG" 2>&1
  echo "calibrate exit $?" | tee -a "$LOG"
  CUDA_VISIBLE_DEVICES="" RELIBRA_CPU_FIT="$DEST/cpu16_gloo_fit.json" timeout 240 $PY -m relibra run \
      --nproc $C_RANKS --nodes 1 "${C_SIZE[@]}" --policies megatron,relibra --json > "$DEST/cpu_ep8.json.partial" 2>> "$LOG"
  rc=$?; echo "(4) exit $rc" | tee -a "$LOG"; land $rc "$DEST/cpu_ep8.json"
fi

say "not checked on this machine"
{
  if [ "$GPUS" -lt 2 ]; then
    echo "- replicas and cross-GPU migration: one GPU gives EP 1 (NCCL runs no two ranks on one GPU)"
    echo "- EP over NCCL (all-to-all between GPUs) and its equivalence check: needs two or more GPUs"
  fi
  $PY - "$DEST/gpu_checks.json" <<'PY'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except OSError:
    print("- every check of (1): it wrote no report (see above)")
    sys.exit()
te = report.get("te_grouped", {})
if te.get("status") == "not checked":
    print(f"- grouped experts with real Transformer Engine: {te.get('why')}")
failed = [k for k, v in report.items() if isinstance(v, dict) and v.get("status") == "failed"]
failed += [f"ddp {k}" for k, v in report.get("ddp", {}).items() if v.get("status") == "failed"]
print("- failed: " + (", ".join(failed) if failed else "none"))
PY
} 2>&1 | tee -a "$LOG"
say "done in $(( $(date +%s) - start )) s"
