"""Notebook 09: the kit's real RL workload (relibra.rl) on this CPU, its reward and its routing trace."""

from __future__ import annotations

import pandas as pd

from relibra.cluster import get_topology
from relibra.experiments.config import Config
from relibra.experiments.machine import this_machine
from relibra.workloads import generate_trace

# RLConfig overrides per profile (relibra.rl.grpo.RLConfig); the step count is Profile.rl_steps.
RL_OVERRIDES: dict[str, dict] = {
    "tiny": {"warmup_steps": 20, "prompts_per_step": 4, "group_size": 2, "micro_batches": 2, "eval_prompts": 0},
    "laptop": {"warmup_steps": 150, "eval_prompts": 64},
    "paper": {},
    "gpu": {},
}
RL_TORCH_THREADS = 1  # the RL run is deterministic for a fixed thread count; 1 gives the same numbers everywhere


def rl_workload(cfg: Config) -> dict:
    """Run the kit's real RL workload (relibra.rl: GRPO on a tiny MoE policy, routing replay) on this CPU.

    Returns {"rewards": one row per GRPO step (step, reward, solved, seconds, ...), "trace": the real
    RoutingTrace it recorded, "traces": {label: trace} with a synthetic trace of the same shape,
    "config": the RLConfig as a dict, "label"/"sim_label": figure subtitles, "hardware"}.
    """
    import torch  # heavy, as relibra.rl is: only the RL run loads them

    from relibra.rl.grpo import RLConfig, run_rl

    steps = int(cfg.extra.get("rl_steps") or cfg.sizes.rl_steps)
    rl_cfg = RLConfig(steps=steps, seed=cfg.seed, **RL_OVERRIDES.get(cfg.profile, {}))
    threads = torch.get_num_threads()
    torch.set_num_threads(RL_TORCH_THREADS)
    try:
        result = run_rl(rl_cfg, progress=False)
    finally:
        torch.set_num_threads(threads)
    rewards = pd.DataFrame(result.history)
    trace = result.trace
    # A synthetic trace of the same model shape, EP, steps and micro-batches, for comparison. It keeps
    # the generator's default tokens per (micro-batch, rank): its sequences are hundreds to thousands of
    # tokens long, so at the RL run's ~70 tokens per slot one sequence would fill whole steps and the
    # comparison would measure packing, not routing.
    s, m, _, ep, _ = trace.loads.shape
    synthetic = generate_trace(trace.model, "mixed", ep, s, seed=cfg.seed, micro_batches=m)
    hardware = this_machine().replace("1 planner thread", f"{RL_TORCH_THREADS} torch thread")
    label = (f"measured: real GRPO run of a tiny MoE ({trace.model.num_layers} layers, {trace.model.num_experts} "
             f"experts, top-{trace.model.top_k}) on {hardware} | {steps} steps, seed {cfg.seed}")
    topo = get_topology("cpu-gloo")
    # The RL trace is tiny (tens of tokens per expert): ReLibra's default minimum of 128 tokens per
    # replica, meant for paper-scale traces, would forbid every replica. Use the cpu-gloo preset's GEMM
    # half-saturation point instead: a replica must take at least the GEMM's fixed cost in tokens.
    sim_params = {p: {"min_replica_tokens": int(topo.gemm_half_tokens)}
                  for p in cfg.policies if p.startswith("relibra") and p != "relibra-reorder"}
    return {
        "sim_policy_params": sim_params,
        "rewards": rewards, "trace": trace, "config": rl_cfg.to_dict(), "seconds": result.seconds,
        "traces": {"real RL (relibra.rl)": trace, "synthetic (mixed, same model shape)": synthetic},
        "eval_before": result.eval_before, "eval_after": result.eval_after,
        "label": label, "hardware": hardware,
        "sim_label": (f"simulated (cpu-gloo cluster preset, {topo.num_nodes} x {topo.gpus_per_node} ranks) on the real "
                      f"RL trace, EP {ep} | {steps} GRPO steps, seed {cfg.seed}"),
    }
