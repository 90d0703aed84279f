"""Notebook 09: the kit's real RL workload (relibra.rl: GRPO on a tiny MoE policy, routing replay) on
this CPU, its reward, its routing trace, and each policy simulated on that trace."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from relibra.cluster import get_topology
from relibra.experiments.base import Fact, summary_facts, PATH, Params, Result, integer, live, param, table, value
from relibra.experiments.dynamics import expert_load_table, shift_table
from relibra.machine import this_machine
from relibra.experiments.profiles import SCALES
from relibra.studies.simulation import simulate_trace
from relibra.experiments.text import step_differences
from relibra.experiments.traces import PROFILE, own_policies
from relibra.labels import IDEALS, short as label
from relibra.setups import load_card
from relibra.workloads import generate_trace

QUESTION = "Does a real RL run route like the synthetic traces, and how do the policies balance it?"
RL_TORCH_THREADS = 1  # the RL run is deterministic for a fixed thread count; 1 gives the same numbers everywhere


@dataclass(frozen=True)
class Sizes:
    """steps: GRPO steps after warm-up; overrides: relibra.rl.grpo.RLConfig fields; sim_steps: the
    trace steps the simulated policies see (the first only history)."""

    steps: int
    sim_steps: int
    overrides: dict = field(default_factory=dict)


SIZES = {
    "tiny": Sizes(2, SCALES["tiny"].steps, {"warmup_steps": 20, "prompts_per_step": 4, "group_size": 2,
                                            "micro_batches": 2, "eval_prompts": 0}),
    "laptop": Sizes(20, SCALES["laptop"].steps, {"warmup_steps": 150, "eval_prompts": 64}),
    "paper": Sizes(60, SCALES["paper"].steps),
    "gpu": Sizes(60, SCALES["gpu"].steps),
}


@dataclass(frozen=True)
class Params(Params):
    profile: str = param("laptop", "RL run sizes", PROFILE, affects=False)
    policies: tuple[str, ...] = own_policies("megatron,eplb,eplb+,relibra,balanced",
                                                "policies simulated on the real trace (None: this notebook's)")
    rl_steps: int = param(None, "GRPO steps of the RL run (None: the profile's)", integer(1, 10000),
                          sizes="steps")
    seed: int = param(0, "same seed, same run", integer(0))
    out_dir: str | None = param(None, "where results go (None: results/interactive/09_rl_workload)", PATH,
                                affects=False)

    def scale_note(self, sizes: Sizes) -> str:
        return (f"{self.profile} profile: the tiny MoE policy of relibra.rl, {self.rl_steps} GRPO steps after "
                f"warm-up, seed {self.seed}")


@dataclass(kw_only=True)
class Result(Result):
    rewards: pd.DataFrame = table("reward per RL step")
    expert_load: pd.DataFrame = table("tokens per expert of the real RL trace, layer 0")
    shift_stats: pd.DataFrame = table("hot-expert overlap and load correlation: real RL trace vs synthetic")
    balancing: pd.DataFrame = table("simulated throughput and skewness of each policy on the real RL trace")
    label: str = value("")
    sim_label: str = value("")
    hardware: str = value("")
    rl: dict = live()


def compute(p: Params, sizes: Sizes) -> Result:
    """Run the RL workload, then simulate every policy on the routing it recorded (cpu-gloo preset)."""
    import torch  # heavy, as relibra.rl is: only the RL run loads them

    from relibra.rl.grpo import RLConfig, run_rl

    rl_cfg = RLConfig(steps=p.rl_steps, seed=p.seed, **sizes.overrides)
    threads = torch.get_num_threads()
    torch.set_num_threads(RL_TORCH_THREADS)
    try:
        run = run_rl(rl_cfg, progress=False)
    finally:
        torch.set_num_threads(threads)
    trace = run.trace
    # A synthetic trace of the same model shape, EP, steps and micro-batches, for comparison. It keeps
    # the generator's default tokens per (micro-batch, rank): its sequences are hundreds to thousands of
    # tokens long, so at the RL run's ~70 tokens per slot one sequence would fill whole steps and the
    # comparison would measure packing, not routing.
    s, m, _, ep, _ = trace.loads.shape
    synthetic = generate_trace(trace.model, "mixed", ep, s, seed=p.seed, micro_batches=m)
    hardware = this_machine().replace("1 planner thread", f"{RL_TORCH_THREADS} torch thread")
    topo = get_topology("cpu-gloo")
    # The RL trace is tiny (tens of tokens per expert): ReLibra's default minimum of 128 tokens per
    # replica, meant for paper-scale traces, would forbid every replica. Use the cpu-gloo preset's GEMM
    # half-saturation point instead: a replica must take at least the GEMM's fixed cost in tokens.
    sim_params = {x: {"min_replica_tokens": int(topo.gemm_half_tokens)}
                  for x in p.policies if x.startswith("relibra") and x != "relibra-reorder"}
    sim = simulate_trace(trace, topo, p.policies, load_card(), sizes.sim_steps, workload="rl", policy_params=sim_params)
    traces = {"real RL (relibra.rl)": trace, "synthetic (mixed, same model shape)": synthetic}
    return Result(rewards=pd.DataFrame(run.history), expert_load=expert_load_table(trace, step=0, layer=0),
                  shift_stats=shift_table(traces), balancing=sim, hardware=hardware,
                  label=(f"measured: real GRPO run of a tiny MoE ({trace.model.num_layers} layers, "
                         f"{trace.model.num_experts} experts, top-{trace.model.top_k}) on {hardware} | {p.rl_steps} "
                         f"steps, seed {p.seed}"),
                  sim_label=(f"simulated (cpu-gloo cluster preset, {topo.num_nodes} x {topo.gpus_per_node} ranks) on "
                             f"the real RL trace, EP {ep} | {p.rl_steps} GRPO steps, seed {p.seed}"),
                  rl={"trace": trace, "traces": traces, "config": rl_cfg.to_dict(), "seconds": run.seconds,
                      "eval_before": run.eval_before, "eval_after": run.eval_after, "sim_policy_params": sim_params})


def reward_trend(rewards: pd.DataFrame) -> tuple[float, float]:
    """(change of the fitted line over the run, spread of the rewards around it: the residuals' std)."""
    steps, reward = rewards["step"].to_numpy(dtype=float), rewards["reward"].to_numpy(dtype=float)
    if len(reward) < 3:
        return float(reward[-1] - reward[0]), float("nan")
    slope, icpt = np.polyfit(steps, reward, 1)
    return float(slope * (steps[-1] - steps[0])), float(np.std(reward - (slope * steps + icpt), ddof=2))


@dataclass(frozen=True)
class SlowerDespiteBalance:
    """A policy with lower skewness than Megatron's that still runs slower, and the step parts that differ
    most (seconds per step against Megatron's, relibra.experiments.text.step_differences)."""

    policy: str
    speedup: float
    skewness: float
    worse: tuple[tuple[str, float], ...]
    better: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Summary:
    first_step: int
    last_step: int
    first_reward: float
    last_reward: float
    trend_change: float  # change of the fitted line over the run
    trend_spread: float  # the rewards' std around it (NaN under 3 steps)
    relibra_speedup: float | None  # over Megatron on the recorded routing
    relibra_skewness: float | None
    megatron_skewness: float | None
    slower: tuple[SlowerDespiteBalance, ...]


def summarize(r: Result) -> Summary:
    rewards, s = r.rewards, r.balancing.set_index("policy")
    change, spread = reward_trend(rewards)
    both = "relibra" in s.index and "megatron" in s.index
    meg = s.loc["megatron", "skewness"] if "megatron" in s.index else None
    slower = tuple(SlowerDespiteBalance(x, q["speedup_vs_megatron"], q["skewness"],
                                        *step_differences(r.balancing, x, "megatron"))
                   for x, q in s.iterrows() if meg is not None and x != "megatron" and x not in IDEALS
                   and q["skewness"] < meg and q["speedup_vs_megatron"] < 1.0)
    return Summary(int(rewards["step"].iloc[0]), int(rewards["step"].iloc[-1]), rewards["reward"].iloc[0],
                   rewards["reward"].iloc[-1], change, spread,
                   s.loc["relibra", "speedup_vs_megatron"] if both else None,
                   s.loc["relibra", "skewness"] if both else None, meg, slower)


def story(s: Summary) -> str:
    text = [f"Mean reward went from {s.first_reward:.3f} at step {s.first_step} to {s.last_reward:.3f} at step "
            f"{s.last_step}."]
    change, spread = s.trend_change, s.trend_spread
    if np.isnan(spread) or abs(change) < 2 * spread:
        text.append(f"That is no sign of learning: the fitted trend moves {change:+.3f} over the run, less than twice "
                    f"the rewards' spread around it ({spread:.3f}); the run is long enough to record real routing, "
                    "not to train the policy.")
    else:
        text.append(f"The fitted trend moves {change:+.3f} over the run, more than twice the rewards' spread around "
                    f"it ({spread:.3f}).")
    if s.relibra_speedup is not None:
        text.append(f"On the recorded routing, ReLibra runs {s.relibra_speedup:.2f}x Megatron (skewness "
                    f"{s.relibra_skewness:.2f} vs {s.megatron_skewness:.2f}).")
    for x in s.slower:
        gains = [f"{k} {1e3 * v:.2f} ms" for k, v in x.better]
        why = (f"per step, {label(x.policy)} spends " + ", ".join(f"{k} +{1e3 * v:.2f} ms" for k, v in x.worse)
               + " more than Megatron" + (f" (and gains {', '.join(gains)})" if gains else ""))
        text.append(f"{label(x.policy)} is slower than Megatron ({x.speedup:.2f}x) although its skewness is "
                    f"lower ({x.skewness:.2f}): {why}.")
    return " ".join(text)


def facts(r: Result, scale: str) -> list[Fact]:
    """The numbers its story tells (its Summary's), one fact each: the rewards measured by the RL run on this
    machine, the policies simulated on its recorded routing."""
    run = f"the RL run (relibra.rl) on this machine; {scale}"
    return [dataclasses.replace(f, scope="measured", on=run) if f.fact in _MEASURED else f
            for f in summary_facts(summarize(r))]


_MEASURED = ("first_step", "last_step", "first_reward", "last_reward", "trend_change", "trend_spread")
