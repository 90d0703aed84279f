"""Notebook 05, intra-batch replication: joint placement + split vs placement only vs splitting only,
and ReLibra against its number of spare replica slots per GPU."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from relibra.errors import ConfigError
from relibra.experiments.base import Result, TryThis, integers, mean_of, param, table
from relibra.experiments.profiles import SCALES, Scale
from relibra.studies.simulation import full_model_memory_share, simulate_trace, simulate_workloads
from relibra.experiments.text import fastest_first, pct, speedup_list
from relibra.experiments.traces import TracedParams, own_policies, traced_sizes
from relibra.policies import get_policy
from relibra.setups import load_card

QUESTION = ("Does joint replica placement and token split beat either alone, and how many spare slots are "
            "worth it?")
SIZES = SCALES
sizes_of = traced_sizes(SIZES)


@dataclass(frozen=True)
class Params(TracedParams):
    policies: tuple[str, ...] = own_policies("relibra-reorder,relibra-split,relibra,megatron")
    spare_slot_counts: tuple[int, ...] = param("1,2,3,4", "spare replica slots per GPU swept in section 2",
                                               integers(0, 16))

    def check(self, notebook: str, sizes) -> None:
        """The spare-slot sweep runs ReLibra's replication, which needs at least one slot per GPU; checked
        here, before any work, rather than by the planner minutes in."""
        if 0 in self.spare_slot_counts:
            raise ConfigError(f"{notebook}: spare_slot_counts must be 1 or more each (ReLibra's replication sweep "
                              f"needs a spare slot per GPU; no replication is the policy relibra-reorder, already "
                              f"compared in section 1), got {','.join(map(str, self.spare_slot_counts))}")
        super().check(notebook, sizes)


@dataclass(kw_only=True)
class Result(Result):
    replication: pd.DataFrame = table("per workload and policy: throughput, GPU skewness, replicas used")
    spare_slots: pd.DataFrame = table("ReLibra throughput and skewness vs spare replica slots per GPU")


def spare_slot_sweep(p: Params, sizes: Scale, policy: str = "relibra") -> pd.DataFrame:
    """`policy` with each number of spare slots per GPU of p.spare_slot_counts, on the single model and
    workload: one row per count with speedup over Megatron, tokens/s, GPU skewness, replica memory
    share and whether it is the policy's default."""
    card = load_card()
    workload = p.the_workload(sizes)
    trace = p.routing(workload, p.ep, sizes, card)
    default = int(get_policy(policy).params().get("spare_slots_per_gpu", 0))
    rows = []
    for n in p.spare_slot_counts:
        summary = simulate_trace(trace, p.cluster, [policy], card, p.steps,
                                 policy_params={policy: {"spare_slots_per_gpu": int(n)}})
        r = summary.set_index("policy").loc[policy]
        rows.append({"model": trace.model.name, "workload": workload, "ep": trace.ep, "cluster": p.cluster.name,
                     "policy": policy, "spare_slots_per_gpu": int(n), "default": int(n) == default,
                     **r[["speedup_vs_megatron", "frac_of_balanced", "tokens_per_s", "skewness",
                          "replica_memory_share"]].astype(float),
                     "replica_memory_share_full_model": float(full_model_memory_share(
                         p.model, trace.ep, trace.num_layers, [r["replica_buffer_bytes"]], [False])[0])})
    return pd.DataFrame(rows)


def compute(p: Params, sizes: Scale, progress: bool = True) -> Result:
    _, summary = simulate_workloads(p, sizes, load_card(), progress)
    return Result(replication=summary, spare_slots=spare_slot_sweep(p, sizes))


@dataclass(frozen=True)
class Replicated:
    """One policy's means over workloads."""

    policy: str
    speedup: float  # over Megatron
    gpu_skewness: float
    replicas_per_gpu: float


@dataclass(frozen=True)
class SlotCount:
    spare_slots: int
    speedup: float
    skewness: float
    replica_memory_share: float  # of the whole model's parameter memory per GPU


@dataclass(frozen=True)
class Summary:
    policies: tuple[Replicated, ...]  # the systems (no ideals), fastest first
    fewest: SlotCount  # ReLibra at the fewest spare slots swept
    most: SlotCount  # ... at the most
    spread: float  # highest - lowest speed-up over the sweep, relative to the fewest slots' speed-up


def _slots(x) -> SlotCount:
    return SlotCount(int(x["spare_slots_per_gpu"]), x["speedup_vs_megatron"], x["skewness"],
                     x["replica_memory_share_full_model"])


def summarize(r: Result) -> Summary:
    means = fastest_first(r.replication, ["gpu_skewness", "replicas_per_gpu"])
    sp = r.spare_slots.sort_values("spare_slots_per_gpu")
    lo = sp.iloc[0]
    return Summary(tuple(Replicated(p, *x) for p, x in means.iterrows()), _slots(lo), _slots(sp.iloc[-1]),
                   float(sp["speedup_vs_megatron"].max() - sp["speedup_vs_megatron"].min()) / lo["speedup_vs_megatron"])


def story(s: Summary) -> str:
    lo, hi = s.fewest, s.most
    text = speedup_list("Mean over workloads", s.policies, lambda x: (
        f"GPU skewness {x.gpu_skewness:.2f}, {x.replicas_per_gpu:.2f} replicas per GPU"))
    text += (f"\n\nFrom {lo.spare_slots} to {hi.spare_slots} spare slots per GPU, ReLibra's throughput moves from "
             f"{lo.speedup:.3f}x to {hi.speedup:.3f}x (spread {pct(s.spread)}) and its skewness from {lo.skewness:.3f} "
             f"to {hi.skewness:.3f}, while the replica buffer grows from {pct(lo.replica_memory_share)} to "
             f"{pct(hi.replica_memory_share)} of the parameter memory.")
    if s.spread < 0.01:
        text += " Extra slots barely matter here: the planner does not fill them (few experts are hot enough)."
    return text


TRIES = (
    TryThis(lambda p, s: {"cluster": "nvl72"}, "ReLibra's GPU skewness",
            lambda r: mean_of(r.replication, "gpu_skewness", policy="relibra"), -1,
            "a copy may then go to any of the 72 GPUs of one NVLink domain, not only to the GPUs of its home's node"),
)
