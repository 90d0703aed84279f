"""The GPU checks of scripts/device_check.sh, one torchrun launch over every GPU of the machine.

    torchrun --standalone --nproc-per-node <GPUs> scripts/device_check.py OUT.json

Process group "cpu:gloo,cuda:nccl": the models and every transfer of the runtime run on the GPUs over
NCCL, the figures the checks compare stay on the host (gloo). Checks, each marked passed / failed /
not checked (with the reason):

  ddp        megatron DDP + get_megatron_optimizer on CUDA, ReLibra against static placement
             (relibra.runtime.verify.megatron_equivalence_worker, tiny preset, 3 steps): float64 with
             Adam, and bfloat16 with the distributed optimizer and gradient clipping; bounds as
             tests/test_megatron_ddp.py: float64 losses 1e-12 and weights 1e-10, bfloat16 losses 1e-2 and
             weights 2 * lr * steps. EP = the number of GPUs (DP 1).
  replicas   replica slots carried tokens and experts migrated between GPUs (needs EP >= 2: two GPUs).
  ep_nccl    the above with EP over NCCL (all-to-all, point-to-point replica and migration transfers
             between GPUs): needs two GPUs.
  te_grouped Transformer Engine's GroupedLinear where TE imports: one parameter per local expert
             (weight0 .. weightN-1, the layout replica slots join as extra members), bfloat16 forward and
             backward against a per-expert matmul, one expert with zero tokens.
  bf16_gemm  expert GEMMs in bfloat16 (relibra.bench.device gemm) run from device_check.sh.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

LR = 1e-2  # megatron_equivalence_worker's AdamW rate (relibra.runtime.megatron_train.MegatronSetup default)
STEPS = 3


def te_grouped_check() -> dict:
    try:
        import transformer_engine.pytorch as te
    except Exception as exc:  # noqa: BLE001 - any import failure means: not installed here
        return {"status": "not checked", "why": f"Transformer Engine does not import here ({type(exc).__name__}: {exc})"}
    torch.manual_seed(0)
    experts, hidden, ffn = 4, 64, 128
    layer = te.GroupedLinear(experts, hidden, ffn, bias=False, params_dtype=torch.bfloat16, device="cuda")
    names = sorted(n for n, _ in layer.named_parameters())
    splits = [5, 0, 17, 10]
    x = torch.randn(sum(splits), hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = layer(x, splits)
    y.float().square().sum().backward()
    weights = [getattr(layer, f"weight{i}") for i in range(experts)]
    ref_x = x.detach().clone().requires_grad_(True)
    ref = torch.cat([part @ w.detach().t() for part, w in zip(torch.split(ref_x, splits), weights)])
    ref.float().square().sum().backward()
    forward = float((y.float() - ref.float()).abs().max())
    input_grad = float((x.grad.float() - ref_x.grad.float()).abs().max())
    scale = float(ref.float().abs().max())
    ok = names == [f"weight{i}" for i in range(experts)] and forward <= 1e-2 * scale and weights[1].grad is not None
    return {"status": "passed" if ok else "failed", "parameters": names, "forward_max_abs_diff": forward,
            "input_grad_max_abs_diff": input_grad, "output_scale": scale,
            "zero_token_expert_grad_zero": bool(weights[1].grad is not None and not weights[1].grad.any())}


def main(out_path: str) -> int:
    gpu = torch.cuda.is_available()  # without one (device_check.sh --dry-run): the same checks on the host
    dist.init_process_group("cpu:gloo,cuda:nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    from relibra.runtime.verify import megatron_equivalence_worker

    setups = [dict(dtype="float64"), dict(dtype="bfloat16", distributed_optimizer=True, clip_grad=1.0)]
    result = megatron_equivalence_worker(rank, world, world, setups, "tiny", STEPS, replica_slots=2,
                                         device="cuda" if gpu else "cpu")
    if rank == 0:
        diffs, checks = result["diffs"], result["checks"]
        bounds = {"float64": (1e-12, 1e-10), "bfloat16": (1e-2, 2 * LR * STEPS)}
        ddp = {}
        for name, d in diffs.items():
            loss_bound, weight_bound = bounds["float64" if name.startswith("float64") else "bfloat16"]
            ok = d["loss"] <= loss_bound and d["param"] <= weight_bound
            ddp[name] = {"status": "passed" if ok else "failed", "loss_max_abs_diff": d["loss"],
                         "param_max_abs_diff": d["param"], "master_max_abs_diff": d["master"],
                         "loss_bound": loss_bound, "weight_bound": weight_bound}
        report = {"gpus": world, "device": torch.cuda.get_device_name() if gpu else "cpu (dry run)", "torch": torch.__version__, "ddp": ddp,
                  "grid": checks.get("grid")}
        moved = [v for k, v in checks.items() if k.endswith(": migrated")]
        carried = [v for k, v in checks.items() if k.endswith(": replicas carried tokens")]
        if world >= 2:
            report["replicas"] = {"status": "passed" if all(moved) and all(carried) else "failed",
                                  "migrated": moved, "replicas_carried_tokens": carried}
            equal = all(v["status"] == "passed" for v in ddp.values())
            report["ep_nccl"] = ({"status": "passed" if equal else "failed", "ep": world} if gpu else
                                 {"status": "not checked", "why": f"no GPU (dry run): EP {world} ran over gloo, "
                                  f"equivalence {'held' if equal else 'failed'}"})
        else:
            why = ("one GPU: EP 1, so no expert has a second GPU to be replicated on or migrated to, and NCCL "
                   "runs no two ranks on one GPU")
            report["replicas"] = {"status": "not checked", "why": why}
            report["ep_nccl"] = {"status": "not checked", "why": "one GPU: no all-to-all between GPUs; "
                                 "EP over NCCL and its equivalence need two or more GPUs"}
        report["te_grouped"] = te_grouped_check() if gpu else {"status": "not checked", "why": "no GPU (dry run)"}
        with open(out_path + ".partial", "w") as f:
            json.dump(report, f, indent=1)
        os.replace(out_path + ".partial", out_path)
        for name in ("ddp", "replicas", "ep_nccl", "te_grouped"):
            part = report[name]
            states = [v["status"] for v in part.values()] if name == "ddp" else [part["status"]]
            print(f"{name:>10}: {', '.join(states)}" + (f" ({part['why']})" if "why" in part else ""))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
