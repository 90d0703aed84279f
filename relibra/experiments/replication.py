"""Notebook 05, intra-batch replication: joint placement + split vs placement only vs splitting only,
and ReLibra against its number of spare replica slots per GPU."""

from __future__ import annotations

import pandas as pd

from relibra.experiments.config import Config
from relibra.experiments.overheads import full_model_memory_share
from relibra.experiments.simulation import simulate_trace, simulate_workloads
from relibra.experiments.traces import make_trace
from relibra.policies import get_policy


def replication_table(cfg: Config, progress: bool = True) -> pd.DataFrame:
    """Per (workload, policy): simulated speedup, tokens/s, GPU skewness and replicas used per GPU."""
    _, summary = simulate_workloads(cfg, progress)
    return summary


def default_spare_slots(policy: str = "relibra") -> int:
    """The policy's default number of spare replica slots per GPU."""
    return int(get_policy(policy).params().get("spare_slots_per_gpu", 0))


def spare_slot_sweep(cfg: Config, slots=(1, 2, 3, 4), policy: str = "relibra") -> pd.DataFrame:
    """ReLibra with each number of spare slots per GPU, on cfg.model / cfg.workload.

    One row per spare-slot count: speedup over Megatron, tokens/s, GPU skewness, replica memory
    share, whether it is the policy's default.
    """
    trace = make_trace(cfg)
    rows = []
    default = default_spare_slots(policy)
    for n in slots:
        summary = simulate_trace(cfg, trace, policies=[policy], policy_params={policy: {"spare_slots_per_gpu": int(n)}})
        r = summary.set_index("policy").loc[policy]
        rows.append({"model": trace.model.name, "workload": cfg.workload, "ep": trace.ep, "cluster": cfg.cluster,
                     "policy": policy, "spare_slots_per_gpu": int(n), "default": int(n) == default,
                     "speedup_vs_megatron": float(r["speedup_vs_megatron"]), "frac_of_balanced": float(r["frac_of_balanced"]),
                     "tokens_per_s": float(r["tokens_per_s"]), "skewness": float(r["skewness"]),
                     "replica_memory_share": float(r["replica_memory_share"]),
                     "replica_memory_share_full_model": float(full_model_memory_share(
                         cfg.model, trace.ep, trace.num_layers, [r["replica_buffer_bytes"]], [False])[0])})
    return pd.DataFrame(rows)
