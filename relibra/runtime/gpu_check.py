"""A short GPU check for a machine with CUDA (NOT run in this session: no GPU was lent).

    OUT=/some/dir python -m relibra.runtime.gpu_check      # or: bash scripts/gpu_check.sh

Writes $OUT/gpu_check.json with
1. runtime: the kit's runtime at world size 1 on CUDA over NCCL (megatron-core MoELayer with the
   alltoall dispatcher, the PlacementRouter, RouterReplay; no CPU patches since CUDA is present):
   a few AdamW steps of the `small` model under static placement, float32; losses (finite?) and
   step seconds. World size 1 cannot exercise replicas or migration (they need a second rank);
2. expert compute vs tokens per expert on the GPU: relibra.costs.measure_expert_gemm (SwiGLU forward,
   bf16) at the Qwen3-30B-A3B and Qwen3-235B-A22B expert shapes, fitted with
   relibra.costs.fit_gemm_efficiency -> matmul_tflops and gemm_half_tokens for a Hopper preset.
Takes a few minutes at most.
"""

from __future__ import annotations

import json
import os
import socket
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def runtime_world1(steps: int = 3, model: str = "small") -> dict:
    import numpy as np
    import torch
    import torch.distributed as dist

    from relibra.runtime.config import ModelConfig, NodeLayout, TrainConfig
    from relibra.runtime.data import TraceData
    from relibra.runtime.engine import Engine
    from relibra.runtime.groups import build_groups, init_distributed
    from relibra.runtime.plans import static_plan
    from relibra.workloads import generate_trace

    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    torch.cuda.set_device(0)
    init_distributed("nccl")
    groups = build_groups(NodeLayout(1, 1))
    trace = generate_trace(model, "math", ep=1, steps=steps, micro_batches=4, tokens_per_rank=4096, token_level=True)
    cfg = ModelConfig.from_preset(model)
    data = TraceData(trace, cfg.shape.vocab_size, 0)
    engine = Engine(cfg, TrainConfig(steps=steps), groups.collection(), 1,
                    np.zeros((cfg.num_layers, cfg.num_experts), dtype=np.int64), device="cuda")
    out = {"model": model, "tokens_per_microbatch": 4096, "micro_batches": 4, "losses": [], "step_s": []}
    for s in range(steps):
        batches = [[data.batch(s, m, 0, cfg.num_layers)] for m in range(4)]
        r = engine.step(static_plan(trace.loads[s], 1), batches, [data.tokens(s, m) for m in range(4)], [0])
        out["losses"].append(r["loss"])
        out["step_s"].append(r["seconds"])
    out["finite"] = bool(np.isfinite(out["losses"]).all())
    dist.destroy_process_group()
    return out


def expert_curves() -> dict:
    from relibra.costs import fit_gemm_efficiency, measure_expert_gemm

    tokens = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    out = {}
    for name, (hidden, ffn) in {"qwen3-30b-a3b": (2048, 768), "qwen3-235b-a22b": (4096, 1536)}.items():
        m = measure_expert_gemm(hidden, ffn, tokens, device="cuda", dtype="bfloat16", repeats=20, threads=None)
        m["fit"] = fit_gemm_efficiency(m["tokens"], m["seconds"], m["flops_per_token"])
        out[name] = m
    return out


def main() -> int:
    import torch

    out_dir = os.environ.get("OUT", ".")
    os.makedirs(out_dir, exist_ok=True)
    result = {"when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "torch": torch.__version__,
              "cuda_available": torch.cuda.is_available()}
    if not torch.cuda.is_available():
        result["error"] = "no CUDA device; nothing measured"
    else:
        result["device"] = torch.cuda.get_device_name()
        for key, fn in (("expert_gemm", expert_curves), ("runtime_world1", runtime_world1)):
            t0 = time.perf_counter()
            try:
                result[key] = fn()
            except Exception as exc:  # record and go on: one failing part must not lose the other
                result[key] = {"error": f"{type(exc).__name__}: {exc}"}
            result[key + "_wall_s"] = time.perf_counter() - t0
    path = os.path.join(out_dir, "gpu_check.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=float)
    print(json.dumps({k: v for k, v in result.items() if k != "expert_gemm"}, indent=1, default=float)[:4000])
    for name, m in result.get("expert_gemm", {}).items() if isinstance(result.get("expert_gemm"), dict) else []:
        if isinstance(m, dict) and "fit" in m:
            print(name, m["fit"])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
