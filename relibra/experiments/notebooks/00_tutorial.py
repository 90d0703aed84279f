"""Notebook 00, the tutorial: a toy one-layer MoE (16 experts, top-2) over EP GPUs in 2 nodes, planned
and priced for every placement x spare-slots choice (relibra.experiments.tutorial)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from relibra.errors import ConfigError
from relibra.experiments.base import (FLAG, PATH, Params, Result, TryThis, choice, integer, live, mean_of, number,
                                      param, table, value)
from relibra.experiments.text import pct
from relibra.experiments.tutorial import (TUTORIAL_EP_SIZES, TUTORIAL_MAX_SPARE_SLOTS, TUTORIAL_PLACEMENTS,
                                          TUTORIAL_SHIFTS, tutorial_case, tutorial_grid, tutorial_replay,
                                          tutorial_skew_sweep, tutorial_timescales)

QUESTION = "What is expert-parallel load imbalance, and how do a placement and replicas fix it?"


def sizes_of(values) -> None:
    """The toy layer reads no profile: its parameters set every size."""
    return None


@dataclass(frozen=True)
class Params(Params):
    ep: int = param(4, "GPUs of the EP group, as 2 nodes x ep/2 GPUs", integer(choices=TUTORIAL_EP_SIZES))
    placement: str = param("search", "static (Megatron) | search (ReLibra's annealing) | lpt (greedy)",
                           choice(TUTORIAL_PLACEMENTS))
    spare_slots: int = param(2, "replica slots per GPU (0: no replication)", integer(0, TUTORIAL_MAX_SPARE_SLOTS))
    skew: float = param(1.2, "Zipf exponent of expert popularity (0: uniform)", number(0.0, 3.0))
    shift: float = param(0.5, "share of the popularity ranking reshuffled between micro-batches", number(0.0, 1.0))
    tokens_per_gpu: int = param(4096, "tokens each GPU routes per micro-batch", integer(1, 1 << 20))
    micro_batches: int = param(4, "micro-batches in the toy step", integer(1, 4096))
    micro_batch: int = param(0, "which micro-batch sections 1-3 show", integer(0))
    seed: int = param(0, "same seed, same numbers", integer(0))
    out_dir: str | None = param(None, "where results go (None: results/interactive/00_tutorial)", PATH,
                                affects=False)
    interactive: bool = param(True, "show the sliders when a live front end is attached", FLAG, affects=False)

    def check(self, notebook: str, sizes) -> None:
        if self.micro_batch >= self.micro_batches:
            raise ConfigError(f"{notebook}: micro_batch must be 0..{self.micro_batches - 1} (micro_batches is "
                              f"{self.micro_batches}), got {self.micro_batch}")

    def case_args(self) -> dict:
        """tutorial_case's keyword arguments."""
        return {k: getattr(self, k) for k in ("ep", "seed", "micro_batches", "placement", "spare_slots", "skew",
                                              "shift", "micro_batch", "tokens_per_gpu")}

    def scale_note(self, sizes) -> str:
        return (f"toy layer: 16 experts, top-2, EP {self.ep} as 2 nodes x {self.ep // 2} GPUs, "
                f"{self.tokens_per_gpu} tokens per GPU, {self.micro_batches} micro-batches, seed {self.seed}")


@dataclass(kw_only=True)
class Result(Result):
    expert_tokens: pd.DataFrame = table("tokens per expert and micro-batch, with its home GPU")
    gpu_load: pd.DataFrame = table("tokens and simulated expert seconds per GPU")
    replicas: pd.DataFrame = table("occupied replica slots: expert, home GPU, tokens taken per micro-batch")
    phases: pd.DataFrame = table("simulated seconds per micro-batch, direction and phase (slowest GPU)")
    placement_replica_grid: pd.DataFrame = table("rank skewness and slowest-GPU time per placement x spare slots")
    skew_sweep: pd.DataFrame = table("slowest-GPU time per placement as the skew slider moves (section 6)")
    replay: pd.DataFrame = table("slowest-GPU time and skewness of a plan from history and one from the replayed "
                                 "exact loads, per micro-batch shift (section 4)")
    replay_shift: float = value()  # this run's shift, one of the replay table's
    timescales: dict = value()  # link rates and one expert's push time over NVLink and RDMA (section 5)
    case: dict = live()


def compute(p: Params, sizes=None) -> Result:
    case = tutorial_case(**p.case_args())
    toy = {k: getattr(p, k) for k in ("shift", "seed", "ep", "tokens_per_gpu", "micro_batches")}  # all but skew
    shifts = tuple(sorted({*TUTORIAL_SHIFTS, p.shift}))
    replay = tutorial_replay(p.placement, p.spare_slots, shifts, p.skew, p.seed, p.ep, p.tokens_per_gpu,
                             p.micro_batches)
    return Result(expert_tokens=case["expert_tokens"], gpu_load=case["gpu_table"], replicas=case["replicas"],
                  phases=case["phases"], placement_replica_grid=tutorial_grid(skew=p.skew, **toy),
                  skew_sweep=tutorial_skew_sweep(p.placement, p.spare_slots, **toy), replay=replay,
                  replay_shift=p.shift, timescales=tutorial_timescales(p.ep), case=case)


@dataclass(frozen=True)
class Choice:
    placement: str
    spare_slots: int
    skewness: float
    slowest_gpu_ms: float
    balanced_ms: float


@dataclass(frozen=True)
class SkewSweep:
    """Static placement's skewness at the slider's lowest skew, its peak and its highest skew; the chosen
    plan's at the peak and where the gap to static is widest (None: no plan swept)."""

    low: float
    static_at_low: float
    peak: float
    static_at_peak: float
    high: float
    static_at_high: float
    plan: tuple[str, int] | None  # placement, spare slots
    plan_at_peak: float | None
    widest_gap: tuple[float, float] | None  # skew, static - plan


@dataclass(frozen=True)
class Replay:
    """Section 4: the slowest GPU's ms planned from history and from the replayed exact loads, at the smallest
    shift, this run's shift and the largest shift; the balanced ms."""

    policy: str
    low: float
    here: float
    high: float
    history: tuple[float, float, float]  # at low, here, high
    replay: tuple[float, float, float]
    balanced_ms: float


@dataclass(frozen=True)
class Summary:
    static: Choice  # static placement, no replicas
    best: Choice  # the fastest slowest GPU of the grid
    same_bars: tuple[tuple[int, int, int, tuple[str, ...]], ...]  # (a, b, slots used, placements): a and b
    # spare slots give the same plan because the planner filled at most `used` slots per GPU
    sweep: SkewSweep
    replay: Replay
    timescales: dict


def _choice(x) -> Choice:
    return Choice(x["placement"], int(x["spare_slots"]), x["skewness"], x["slowest_gpu_ms"], x["balanced_ms"])


def _is_static(t: pd.DataFrame) -> pd.Series:
    return (t["placement"] == "static") & (t["spare_slots"] == 0)


def _skew_sweep(sweep: pd.DataFrame) -> SkewSweep:
    is_static = _is_static(sweep)
    static, rest = sweep[is_static].set_index("skew")["skewness"], sweep[~is_static]
    lo, peak, hi = static.index.min(), static.idxmax(), static.index.max()
    plan = rest.set_index("skew")["skewness"] if len(rest) else None
    gap = None if plan is None else static - plan
    return SkewSweep(lo, static[lo], peak, static[peak], hi, static.iloc[-1],
                     None if plan is None else (rest["placement"].iloc[0], int(rest["spare_slots"].iloc[0])),
                     None if plan is None else plan[peak], None if gap is None else (gap.idxmax(), gap.max()))


def summarize(r: Result) -> Summary:
    grid = r.placement_replica_grid
    g = grid.set_index(["placement", "spare_slots"])
    slots = sorted(grid["spare_slots"].unique())
    same = {}
    for placement in grid["placement"].unique():
        for a, b in zip(slots[1:], slots[2:]):
            ra, rb = g.loc[(placement, a)], g.loc[(placement, b)]
            if np.isclose(ra["slowest_gpu_ms"], rb["slowest_gpu_ms"]) and rb["max_replicas_per_gpu"] <= a:
                same.setdefault((a, b, int(rb["max_replicas_per_gpu"])), []).append(placement)
    return Summary(_choice(grid[_is_static(grid)].iloc[0]), _choice(grid.loc[grid["slowest_gpu_ms"].idxmin()]),
                   tuple((*k, tuple(v)) for k, v in same.items()), _skew_sweep(r.skew_sweep),
                   _replay(r.replay, r.replay_shift), dict(r.timescales))


def _replay(t: pd.DataFrame, here: float) -> Replay:
    ms = t.pivot(index="shift", columns="plan", values="slowest_gpu_ms")
    low, high = float(ms.index.min()), float(ms.index.max())
    at = [low, float(here), high]
    return Replay(str(t["policy"].iloc[0]), *at, tuple(float(ms.loc[x, "history"]) for x in at),
                  tuple(float(ms.loc[x, "replay"]) for x in at), float(t["balanced_ms"].mean()))


def story(s: Summary) -> str:
    base, best = s.static, s.best
    text = [f"Static placement without replicas: skewness {base.skewness:.2f}, slowest GPU "
            f"{base.slowest_gpu_ms:.3f} ms. The best choice here, {best.placement} with {best.spare_slots} "
            f"spare slot(s), reaches skewness {best.skewness:.2f} and {best.slowest_gpu_ms:.3f} ms "
            f"(balanced: {best.balanced_ms:.3f} ms)."]
    for a, b, used, placements in s.same_bars:
        text.append(f"With {', '.join(placements)} placement, {a} and {b} spare slots give the same bars because "
                    f"the planner filled at most {used} slot(s) per GPU even when given {b}, so the plans are "
                    f"identical: its water-filling stops once the GPUs of each node are level with the node's mean, "
                    f"and {used} copy per GPU got there.")
    return " ".join(text)


def _at(case: dict, table: str, micro_batch: int) -> pd.DataFrame:
    t = case[table]
    return t[t["micro_batch"] == micro_batch]


def load_story(case: dict, micro_batch: int = 0) -> str:
    g, et = _at(case, "gpu_table", micro_batch), _at(case, "expert_tokens", micro_batch)
    busiest, hot, mean = g.loc[g["tokens"].idxmax()], et.loc[et["tokens"].idxmax()], float(g["tokens"].mean())
    text = (f"In micro-batch {micro_batch}, GPU {int(busiest['gpu'])} computes {int(busiest['tokens'])} "
            f"token-expert pairs, {busiest['tokens'] / mean:.2f}x the mean of {mean:.0f}; every other GPU waits "
            f"for it. The hottest expert, e{int(hot['expert'])} (home: GPU {int(hot['home_gpu'])}), alone receives "
            f"{int(hot['tokens'])} pairs, {pct(hot['tokens'] / et['tokens'].sum())} of the layer's.")
    reps = _at(case, "replicas", micro_batch)
    if len(reps):
        moved = int(reps["replica_tokens"].sum())
        text += (f" The plan fills {len(reps)} replica slot(s) and moves {moved} pairs "
                 f"({pct(moved / mean / len(g))} of the layer) onto copies.")
    elif case["spare_slots"] == 0:
        text += " With 0 spare slots there are no replicas: only the placement decides the balance."
    else:
        text += " The planner left every spare slot empty: no copy would carry enough tokens to pay for itself."
    return text


def plan_story(case: dict, micro_batch: int = 0) -> str:
    reps, gpn = _at(case, "replicas", micro_batch), case["gpus_per_node"]
    lines = [f"- e{int(r['expert'])} (home GPU {int(r['home_gpu'])}, node {int(r['home_gpu']) // gpn}): "
             f"{int(r['replica_tokens'])} of its {int(r['expert_tokens'])} tokens go to its copy on GPU "
             f"{int(r['gpu'])} (node {int(r['gpu']) // gpn}); {int(r['home_tokens'])} stay home."
             for _, r in reps.iterrows()]
    moved = case["summary"]["experts_moved_from_static"].iloc[0]
    head = (f"The plan moves {moved} of 16 expert homes away from the static layout"
            + (" (search/LPT placement)" if moved else "") + ". ")
    if not lines:
        return head + "It holds no replica in this micro-batch."
    return head + "Its replicas, each inside its home's node:\n\n" + "\n".join(lines)


def phase_story(case: dict, micro_batch: int = 0) -> str:
    p = _at(case, "phases", micro_batch)
    fwd = p[p["direction"] == "forward"].set_index("phase")["seconds"]
    total, a2a = float(fwd.sum()), float(fwd.get("dispatch", 0) + fwd.get("combine", 0))
    return (f"Forward, this layer takes {1e3 * total:.3f} ms for micro-batch {micro_batch}: all-to-all "
            f"{pct(a2a / total)}, expert compute {pct(fwd.get('expert_compute', 0) / total)} (the slowest GPU's), "
            f"attention {pct(fwd.get('dense_compute', 0) / total)}. Balancing shortens only the expert-compute "
            f"part (and the all-to-all's wait on the busiest receiver); backward repeats it at twice the FLOPs.")


def skew_story(s: Summary) -> str:
    """Section 6: where static placement's skewness peaks and how far the chosen plan holds it down."""
    w = s.sweep
    text = (f"At skew {w.low:g} static placement's skewness is {w.static_at_low:.2f}: with uniform routing there is "
            f"little to fix. It peaks at {w.static_at_peak:.2f} at skew {w.peak:g}")
    if w.plan is not None:
        text += (f", where the chosen plan ({w.plan[0]}, {w.plan[1]} spare slot(s)) holds it to {w.plan_at_peak:.2f}; "
                 f"the gap between them is widest at skew {w.widest_gap[0]:g} ({w.widest_gap[1]:.2f})")
    text += "."
    if w.peak < w.high and w.static_at_high < w.static_at_peak - 0.05:
        text += (f" Past skew {w.peak:g} static placement's skewness falls again (to {w.static_at_high:.2f} at "
                 f"{w.high:g}): each token picks two distinct experts, so when nearly every token picks "
                 "the same two, their two GPUs share the load.")
    return text


def replay_story(s: Summary) -> str:
    """Section 4: what planning from history costs as the micro-batch shift grows, and what replay keeps."""
    w, (h0, hh, h1), (r0, rh, r1) = s.replay, s.replay.history, s.replay.replay
    text = (f"At shift {w.low:g} the two plans are alike: the slowest GPU takes {h0:.3f} ms planned from the "
            f"previous step and {r0:.3f} ms planned from the replayed loads (balanced: {w.balanced_ms:.3f} ms). "
            f"At shift {w.high:g} the plan from history reaches {h1:.3f} ms ({h1 / w.balanced_ms:.2f}x balanced): its "
            f"homes and copies were chosen for experts that are no longer hot. The replay plan, made from the "
            f"exact loads of each micro-batch, stays at {r1:.3f} ms ({r1 / w.balanced_ms:.2f}x balanced)")
    if w.low < w.here < w.high:
        text += f"; at this run's shift, {w.here:g}, history gives {hh:.3f} ms and replay {rh:.3f} ms"
    text += "."
    if abs(h1 - r1) < 1e-3 * r1:
        text += (f" Here both plans are the same ({w.policy}: nothing it decides depends on the loads), so "
                 "history costs nothing; choose a placement other than static, or spare slots, to see the gap.")
    elif r1 > r0 * 1.02:
        text += (f" The replay plan's slowest GPU still rises {pct(r1 / r0 - 1)} from shift {w.low:g} to "
                 f"{w.high:g} (history's: {pct(h1 / h0 - 1)}): its homes are set once per step (section 5), so "
                 "when the hot experts move between micro-batches, one node can hold more than its share, and "
                 "copies inside a node cannot move load to the other node.")
    return text


def timescale_story(s: Summary) -> str:
    """Section 5: the two timescales, from the toy cluster's link rates."""
    t = s.timescales
    return (f"On the `{t['topology']}` links (the `paper` preset of relibra/cluster.py: NVLink "
            f"{t['nvlink_GBps']:g} GB/s and RDMA {t['rdma_GBps']:g} GB/s per GPU, each way), one toy expert's "
            f"weights, {t['expert_bytes'] / 1e6:.1f} MB in bf16, take {t['nvlink_us']:.0f} us to copy to a GPU of "
            f"the same node and {t['rdma_us']:.0f} us to a GPU of the other node, "
            f"{t['nvlink_GBps'] / t['rdma_GBps']:.1f}x longer. A micro-batch's expert compute "
            f"on the slowest GPU is about {s.best.slowest_gpu_ms * 1e3:.0f} us, so a copy per micro-batch pays "
            "for itself only over NVLink, where it also hides behind attention; across nodes the kit moves "
            "expert homes instead, once per step, and that one migration is spread over all the step's "
            "micro-batches.")


def _replay_ms(r: Result, plan: str) -> float:
    """The slowest-GPU ms of the plan from "history" or "replay" at this run's shift (section 4)."""
    return mean_of(r.replay, "slowest_gpu_ms", plan=plan, shift=r.replay_shift)


def _static_skewness(r: Result) -> float:
    return mean_of(r.placement_replica_grid, "skewness", placement="static", spare_slots=0)


TRIES = (
    TryThis(lambda p, s: {"skew": 0.0}, "static placement's rank skewness (the first figure, 0 spare slots)",
            _static_skewness, -1, "with uniform routing no expert is hot enough to pile tokens on one GPU"),
    TryThis(lambda p, s: {"spare_slots": 0}, "the slowest GPU's expert time in this plan",
            lambda r: mean_of(r.case["summary"], "slowest_gpu_ms"), +1,
            "without copies nothing takes tokens off the GPU that holds a hot expert"),
    TryThis(lambda p, s: {"ep": 16}, "static placement's rank skewness (the first figure, 0 spare slots)",
            _static_skewness, +1, "at EP 16 each GPU holds one expert, so a hot expert is a hot GPU"),
    TryThis(lambda p, s: {"shift": 1.0}, "the slowest GPU's expert time of the plan made from history (section 4, "
            "at this run's shift)", lambda r: _replay_ms(r, "history"), +1,
            "the previous step's hot experts are no longer this step's, so its homes and copies sit in the wrong "
            "places; the replay plan's, made from the exact loads, moves far less (section 4 shows both)"),
    TryThis(lambda p, s: {"shift": 0.0}, "how much longer the plan from history's slowest GPU takes than the replay "
            "plan's (section 4, at this run's shift)", lambda r: _replay_ms(r, "history") - _replay_ms(r, "replay"),
            -1,
            "when the hot experts never move, the previous step predicts this one and history is as good as replay"),
)
