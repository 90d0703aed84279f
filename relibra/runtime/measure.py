"""Measured megatron-vs-relibra expert compute and step time at EP 4 (2 nodes x 2 ranks) on this
machine, next to the simulator's prediction with the calibrated `cpu-gloo` preset.

    python -m relibra.runtime.measure --trace data/tiny_math_ep4.npz --repeats 3 --out data/cpu_gloo_runtime.json

One launch (process start-up and megatron imports are paid once) trains each policy `repeats` times
from the same seed, alternating policies so that background load hits both alike; every run does
`warmup` untimed steps and then `steps` timed ones. Per (policy, repeat, step): the slowest rank's
step seconds, each rank's expert compute seconds (forward + backward, the routed_experts_compute
region: permutation into slots and the SequentialMLP loop), tokens, all-to-all and transfer seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import numpy as np
import pandas as pd

from relibra.runtime.options import RunOptions


def measure_worker(rank: int, world: int, opts: RunOptions, policies: list[str], repeats: int,
                   prepared: dict) -> dict:
    import torch

    from relibra.runtime.config import NodeLayout
    from relibra.runtime.groups import build_groups
    from relibra.runtime.train import run_plans
    from relibra.runtime.verify import gather_list

    torch.set_num_threads(opts.threads_per_rank)
    groups = build_groups(NodeLayout(world, opts.nodes))
    rows = []
    for rep in range(repeats):
        for policy in policies:
            trace, plans, _ = prepared[policy]
            r, _, _, _ = run_plans(rank, world, groups, opts, trace, plans, policy,
                                   max(p.replica_slots for p in plans), opts.dtype)
            rows += [{**x, "repeat": rep} for x in r]
    parts = gather_list(rows)
    return {"rows": [x for p in parts for x in p]} if rank == 0 else {}


def simulate_plans(trace, plans: list, warmup: int, topology) -> list[dict]:
    """relibra.costs.cost_plan of every timed plan: step seconds and per-GPU expert seconds (fwd + bwd)."""
    from relibra.costs import CostParams, cost_plan

    seq = int(trace.loads[0, 0, 0].sum(axis=1).max() // trace.model.top_k)  # tokens per rank = one sequence
    out = []
    prev = plans[warmup - 1].home if warmup > 0 else None
    for s in range(warmup, len(plans)):
        c = cost_plan(plans[s], trace.model, topology, CostParams(seq_len=max(seq, 1), include_lm_head=True),
                      prev_home=prev)
        expert = 3.0 * c.expert_seconds_per_gpu.sum(axis=(0, 1))  # forward x (1 + 2 backward)
        out.append({"step": s - warmup, "step_s": c.step_seconds, "expert_s_per_rank": expert.tolist(),
                    "expert_s_max": float(expert.max()), "tokens_per_rank": c.gpu_tokens.sum(axis=(0, 1)).tolist(),
                    "a2a_s": float(sum(c.forward[k].sum() + c.backward[k].sum() for k in ("dispatch", "combine"))),
                    "migration_s": c.migration_s})
        prev = plans[s].home
    return out


def summarize_measured(rows: list[dict]) -> pd.DataFrame:
    """One row per policy: mean and spread over (repeat, step) of slowest-rank figures."""
    df = pd.DataFrame(rows)
    per_rank = df.groupby(["policy", "repeat", "step", "rank", "component"], as_index=False)[["seconds", "tokens"]].sum()
    wide = per_rank.pivot_table(index=["policy", "repeat", "step", "rank"], columns="component", values="seconds",
                                aggfunc="sum", fill_value=0.0)
    tokens = per_rank[per_rank.component == "expert_compute"].set_index(["policy", "repeat", "step", "rank"])["tokens"]
    wide["tokens"] = tokens
    transfer_cols = [c for c in ("replica_push", "replica_grad", "migration") if c in wide]
    wide["transfer"] = wide[transfer_cols].sum(axis=1) if transfer_cols else 0.0
    wide["a2a"] = wide.get("dispatch", 0.0) + wide.get("combine", 0.0)
    per_step = wide.groupby(["policy", "repeat", "step"]).agg(
        step_s=("step_total", "max"), expert_max_s=("expert_compute", "max"), expert_mean_s=("expert_compute", "mean"),
        expert_min_s=("expert_compute", "min"), a2a_max_s=("a2a", "max"), transfer_max_s=("transfer", "max"),
        tokens_max=("tokens", "max"), tokens_mean=("tokens", "mean"))
    per_step["token_skew"] = per_step.tokens_max / per_step.tokens_mean
    agg = {}
    for col in ("step_s", "expert_max_s", "expert_mean_s", "expert_min_s", "a2a_max_s", "transfer_max_s", "token_skew"):
        g = per_step.groupby("policy")[col]
        agg[col] = g.mean()
        agg[col + "_std"] = g.std(ddof=1)
    agg["n"] = per_step.groupby("policy")["step_s"].count()
    return pd.DataFrame(agg)


def main(argv: list[str] | None = None) -> int:
    from relibra.cluster import get_topology
    from relibra.runtime.launch import launch
    from relibra.runtime.train import prepare

    p = argparse.ArgumentParser(prog="python -m relibra.runtime.measure")
    p.add_argument("--trace", default=None)
    p.add_argument("--model", default="tiny")
    p.add_argument("--tokens-per-rank", type=int, default=256)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--policies", default="megatron,relibra")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--calibration", default="data/cpu_gloo_calibration.json",
                   help="JSON from relibra.runtime.calibrate; its cpu_gloo_preset overrides the preset's numbers")
    p.add_argument("--out", default=None)
    p.add_argument("--rows", default=None, help="cache of the measured rows (JSON): written after the launch, "
                   "reused instead of launching when it exists")
    p.add_argument("--policy-param", action="append", default=[], metavar="POLICY:KEY=VALUE")
    args = p.parse_args(argv)
    policies = [x for x in args.policies.split(",") if x]
    params: dict[str, dict] = {name: {} for name in policies}
    for item in args.policy_param:
        name, kv = item.split(":", 1)
        key, value = kv.split("=", 1)
        params[name][key] = int(value) if value.lstrip("-").isdigit() else value
    base = RunOptions(nodes=2, steps=args.steps, warmup_steps=args.warmup, trace=args.trace, model=args.model,
                      tokens_per_rank=args.tokens_per_rank, micro_batches=args.micro_batches)
    prepared = {name: prepare(dataclasses.replace(base, policy=name, policy_params=params[name]), 4)
                for name in policies}
    if args.rows and os.path.exists(args.rows):
        with open(args.rows) as f:
            result = {"rows": json.load(f)}
    else:
        result = launch(measure_worker, 4, base, policies, args.repeats, prepared)
        if args.rows:
            with open(args.rows, "w") as f:
                json.dump(result["rows"], f, default=float)
    table = summarize_measured(result["rows"])
    topo = get_topology("cpu-gloo")
    try:
        with open(args.calibration) as f:
            cal = json.load(f)["cpu_gloo_preset"]
        topo = topo.with_changes(**{k: v for k, v in cal.items() if k != "note"})
    except FileNotFoundError:
        pass
    try:
        sim = {name: simulate_plans(prepared[name][0], prepared[name][1], args.warmup, topo) for name in policies}
        table["sim_step_s"] = pd.Series({n: float(np.mean([r["step_s"] for r in sim[n]])) for n in policies})
        table["sim_expert_max_s"] = pd.Series({n: float(np.mean([r["expert_s_max"] for r in sim[n]])) for n in policies})
        table["sim_a2a_s"] = pd.Series({n: float(np.mean([r["a2a_s"] for r in sim[n]])) for n in policies})
    except Exception as exc:  # the simulator is another part of the kit; report, do not lose the measurement
        sim = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"simulator prediction unavailable: {sim['error']}")
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        print(table.to_string(float_format=lambda x: f"{x:.4f}"))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"how": "relibra.runtime.measure " + " ".join(argv or []), "trace": args.trace,
                       "topology": topo.to_dict(), "table": json.loads(table.to_json(orient="index")),
                       "simulated": sim, "rows": result["rows"]}, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
