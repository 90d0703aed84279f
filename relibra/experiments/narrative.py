"""The text a notebook prints after its results, computed from those results (never hard-coded).

Every function takes the tidy tables the experiments return and gives markdown: which policy wins,
by how much, and the figure in the same table that explains why. `show(text)` displays it in a
notebook (markdown) or prints it elsewhere.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from relibra.cluster import get_model
from relibra.labels import IDEALS, RATIO_LABELS, knob_value, short as label


def show(text: str) -> None:
    """Display markdown in a notebook; print it elsewhere."""
    try:
        from IPython import get_ipython  # notebook-only dependency
        from IPython.display import Markdown, display

        if get_ipython() is not None:
            display(Markdown(text))
            return
    except ImportError:
        pass
    print(text)


def ranked(table: pd.DataFrame, index, values: str, columns: str = "policy", ascending: bool = False) -> pd.DataFrame:
    """A pivot of `values` (mean) whose columns are sorted by their mean, best first (descending by
    default): a table sorted by what it teaches, not alphabetically."""
    wide = table.pivot_table(index=index, columns=columns, values=values)
    return wide[wide.mean().sort_values(ascending=ascending).index]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def model_differences(models) -> str:
    """One line per model preset: experts, top-k, MoE layers, hidden and expert sizes (how they differ)."""
    parts = []
    for m in dict.fromkeys(models):
        s = get_model(m)
        parts.append(f"{m}: {s.num_experts} experts, top-{s.top_k}, {s.num_layers} MoE layers, hidden {s.hidden}, "
                     f"expert FFN {s.moe_ffn}")
    return "; ".join(parts)


def step_components(summary: pd.DataFrame) -> pd.DataFrame:
    """Seconds per step of each policy split into all-to-all, expert compute, exposed replica transfers,
    migration and the rest (dense layers, optimizer, exposed planner), from a simulator summary."""
    s = summary.set_index("policy")
    out = pd.DataFrame({
        "all-to-all": s["a2a_share"] * s["step_s"],
        "expert compute": s["expert_share"] * s["step_s"],
        "exposed replica transfers": s["exposed_transfer_share"] * s["step_s"],
        "migration": s["migration_s"],
    })
    out["the rest"] = s["step_s"] - out.sum(axis=1)
    out["step"] = s["step_s"]
    return out


def explain_gap(summary: pd.DataFrame, slower: str, faster: str) -> str:
    """Why `slower` takes longer per step than `faster`: the components that differ most, in ms."""
    c = step_components(summary)
    if slower not in c.index or faster not in c.index:
        return ""
    diff = (c.loc[slower] - c.loc[faster]).drop("step")
    worse = diff[diff > 5e-6].sort_values(ascending=False)  # parts that differ by at least 0.01 ms
    better = diff[diff < -5e-6].sort_values()
    parts = [f"{k} +{1e3 * v:.2f} ms" for k, v in worse.head(2).items()]
    gains = [f"{k} {1e3 * v:.2f} ms" for k, v in better.head(1).items()]
    return (f"per step, {label(slower)} spends " + ", ".join(parts) + " more than " + label(faster)
            + (f" (and gains {', '.join(gains)})" if gains else ""))


# ---- 00 tutorial ------------------------------------------------------------------------------------
def tutorial_load_story(case: dict, micro_batch: int = 0) -> str:
    g = case["gpu_table"]
    g = g[g["micro_batch"] == micro_batch]
    et = case["expert_tokens"]
    et = et[et["micro_batch"] == micro_batch]
    busiest = g.loc[g["tokens"].idxmax()]
    hot = et.loc[et["tokens"].idxmax()]
    mean = float(g["tokens"].mean())
    text = (f"In micro-batch {micro_batch}, GPU {int(busiest['gpu'])} computes {int(busiest['tokens'])} "
            f"token-expert pairs, {busiest['tokens'] / mean:.2f}x the mean of {mean:.0f}; every other GPU waits "
            f"for it. The hottest expert, e{int(hot['expert'])} (home: GPU {int(hot['home_gpu'])}), alone receives "
            f"{int(hot['tokens'])} pairs, {_pct(hot['tokens'] / et['tokens'].sum())} of the layer's.")
    reps = case["replicas"]
    reps = reps[reps["micro_batch"] == micro_batch]
    if len(reps):
        moved = int(reps["replica_tokens"].sum())
        text += (f" The plan fills {len(reps)} replica slot(s) and moves {moved} pairs "
                 f"({_pct(moved / mean / len(g))} of the layer) onto copies.")
    elif case["spare_slots"] == 0:
        text += " With 0 spare slots there are no replicas: only the placement decides the balance."
    else:
        text += " The planner left every spare slot empty: no copy would carry enough tokens to pay for itself."
    return text


def tutorial_plan_story(case: dict, micro_batch: int = 0) -> str:
    reps = case["replicas"]
    reps = reps[reps["micro_batch"] == micro_batch]
    gpn = case["gpus_per_node"]
    lines = []
    for _, r in reps.iterrows():
        lines.append(f"- e{int(r['expert'])} (home GPU {int(r['home_gpu'])}, node {int(r['home_gpu']) // gpn}): "
                     f"{int(r['replica_tokens'])} of its {int(r['expert_tokens'])} tokens go to its copy on GPU "
                     f"{int(r['gpu'])} (node {int(r['gpu']) // gpn}); {int(r['home_tokens'])} stay home.")
    moved = case["summary"]["experts_moved_from_static"].iloc[0]
    head = (f"The plan moves {moved} of 16 expert homes away from the static layout"
            + (" (search/LPT placement)" if moved else "") + ". ")
    if not lines:
        return head + "It holds no replica in this micro-batch."
    return head + "Its replicas, each inside its home's node:\n\n" + "\n".join(lines)


def tutorial_phase_story(case: dict, micro_batch: int = 0) -> str:
    p = case["phases"]
    p = p[p["micro_batch"] == micro_batch]
    fwd = p[p["direction"] == "forward"].set_index("phase")["seconds"]
    total = float(fwd.sum())
    a2a = float(fwd.get("dispatch", 0) + fwd.get("combine", 0))
    return (f"Forward, this layer takes {1e3 * total:.3f} ms for micro-batch {micro_batch}: all-to-all "
            f"{_pct(a2a / total)}, expert compute {_pct(fwd.get('expert_compute', 0) / total)} (the slowest GPU's), "
            f"attention {_pct(fwd.get('dense_compute', 0) / total)}. Balancing shortens only the expert-compute "
            f"part (and the all-to-all's wait on the busiest receiver); backward repeats it at twice the FLOPs.")


def tutorial_grid_story(grid: pd.DataFrame) -> str:
    g = grid.set_index(["placement", "spare_slots"])
    base = g.loc[("static", 0)]
    best = grid.loc[grid["slowest_gpu_ms"].idxmin()]
    text = [f"Static placement without replicas: skewness {base['skewness']:.2f}, slowest GPU "
            f"{base['slowest_gpu_ms']:.3f} ms. The best choice here, {best['placement']} with {int(best['spare_slots'])} "
            f"spare slot(s), reaches skewness {best['skewness']:.2f} and {best['slowest_gpu_ms']:.3f} ms "
            f"(balanced: {best['balanced_ms']:.3f} ms)."]
    slots = sorted(grid["spare_slots"].unique())
    same = {}
    for placement in grid["placement"].unique():
        for a, b in zip(slots[1:], slots[2:]):
            ra, rb = g.loc[(placement, a)], g.loc[(placement, b)]
            if np.isclose(ra["slowest_gpu_ms"], rb["slowest_gpu_ms"]) and rb["max_replicas_per_gpu"] <= a:
                same.setdefault((a, b, int(rb["max_replicas_per_gpu"])), []).append(placement)
    for (a, b, used), placements in same.items():
        text.append(f"With {', '.join(placements)} placement, {a} and {b} spare slots give the same bars because "
                    f"the planner filled at most {used} slot(s) per GPU even when given {b}, so the plans are "
                    f"identical: its water-filling stops once the GPUs of each node are level with the node's mean, "
                    f"and {used} copy per GPU got there.")
    return " ".join(text)


def tutorial_skew_story(sweep: pd.DataFrame) -> str:
    """What the skew slider shows (tutorial.tutorial_skew_sweep): where static placement's skewness
    peaks, how far the chosen plan holds it down, and whether the gap opens with skew."""
    is_static = (sweep["placement"] == "static") & (sweep["spare_slots"] == 0)
    static, rest = sweep[is_static].set_index("skew")["skewness"], sweep[~is_static]
    lo, peak = static.index.min(), static.idxmax()
    text = (f"At skew {lo:g} static placement's skewness is {static[lo]:.2f}: with uniform routing there is little "
            f"to fix. It peaks at {static[peak]:.2f} at skew {peak:g}")
    if len(rest):
        plan = rest.set_index("skew")["skewness"]
        gap = static - plan
        text += (f", where the chosen plan ({rest['placement'].iloc[0]}, {int(rest['spare_slots'].iloc[0])} spare "
                 f"slot(s)) holds it to {plan[peak]:.2f}; the gap between them is widest at skew {gap.idxmax():g} "
                 f"({gap.max():.2f})")
    text += "."
    if static.idxmax() < static.index.max() and static.iloc[-1] < static.max() - 0.05:
        text += (f" Past skew {peak:g} static placement's skewness falls again (to {static.iloc[-1]:.2f} at "
                 f"{static.index.max():g}): each token picks two distinct experts, so when nearly every token picks "
                 "the same two, their two GPUs share the load.")
    return text


# ---- 01 routing dynamics ----------------------------------------------------------------------------
def dynamics_story(shift: pd.DataFrame, errors: pd.DataFrame, skew: pd.DataFrame) -> str:
    v = shift.groupby(["comparison", "metric"])["value"].mean()
    mb = v.get(("consecutive micro-batches", "hot-expert overlap"), np.nan)
    st = v.get(("consecutive steps", "hot-expert overlap"), np.nan)
    e = errors.groupby(["predictor", "target"])["error"].mean()
    s = skew.groupby("scope")["skewness"].mean()
    out = [f"Consecutive micro-batches share {_pct(mb)} of their hottest 10% of experts; consecutive whole steps "
           f"share {_pct(st)}."]
    if ("history", "micro-batch") in e:
        out.append(f"A history prediction (EPLB's input) puts {_pct(e[('history', 'micro-batch')])} of a micro-batch's "
                   f"token-slots on the wrong experts ({_pct(e.get(('history', 'whole step'), np.nan))} of a whole "
                   f"step's); even the exact step total (EPLB+'s input) misplaces "
                   f"{_pct(e.get(('this step (oracle)', 'micro-batch'), np.nan))} of a micro-batch's.")
    mb_s, st_s = s.get("micro-batch", np.nan), s.get("whole step", np.nan)
    if mb_s > st_s + 0.02:
        out.append(f"Under static placement, the mean skewness is {mb_s:.2f} per micro-batch but {st_s:.2f} for the "
                   f"summed step: balancing the step's total hides imbalance that every micro-batch pays for.")
    else:
        out.append(f"Under static placement, the mean skewness is {mb_s:.2f} per micro-batch and {st_s:.2f} for the "
                   f"summed step: here the hot experts stay hot across the step's micro-batches, so a step-level "
                   f"placement would see the same imbalance.")
    return " ".join(out)


# ---- 02 throughput / 03 ablation ----------------------------------------------------------------------
def throughput_story(table: pd.DataFrame) -> str:
    """Per model: ReLibra's speedup and share of balanced, the best other policy, and why (skewness)."""
    out = []
    for model, d in table.groupby("model", sort=False):
        s = d.groupby("policy")[["speedup_vs_megatron", "frac_of_balanced", "skewness"]].mean()
        if "relibra" not in s.index:
            continue
        r = s.loc["relibra"]
        others = s.drop(index=[p for p in ("relibra",) + IDEALS if p in s.index])
        line = (f"- **{model}**: ReLibra runs {r['speedup_vs_megatron']:.2f}x Megatron's throughput and reaches "
                f"{_pct(r['frac_of_balanced'])} of balanced, because its mean rank skewness is {r['skewness']:.2f}")
        if "megatron" in s.index:
            line += f" against Megatron's {s.loc['megatron', 'skewness']:.2f}"
        if len(others):
            best = others["speedup_vs_megatron"].idxmax()
            line += (f". Best other policy: {label(best)} at {others.loc[best, 'speedup_vs_megatron']:.2f}x "
                     f"(skewness {others.loc[best, 'skewness']:.2f})")
        out.append(line + ".")
    return "Averaged over workloads:\n\n" + "\n".join(out) if out else "ReLibra was not simulated."


def ablation_story(table: pd.DataFrame) -> str:
    """Each stage's speed-up and skewness, how much of ReLibra's gain each mechanism gives alone, and
    whether the two add up."""
    s = table.groupby("policy")[["speedup_vs_megatron", "skewness"]].mean()
    stages = [p for p in ("relibra-reorder", "relibra-replicate", "relibra") if p in s.index]
    text = "Averaged over models and workloads, relative to Megatron: " + "; ".join(
        f"{label(p)} {s.loc[p, 'speedup_vs_megatron']:.2f}x (skewness {s.loc[p, 'skewness']:.2f})" for p in stages) + "."
    if len(stages) < 3:
        return text
    ro, rp, both = (s.loc[p, "speedup_vs_megatron"] - 1 for p in stages)
    if both > 0:
        text += (f" Of ReLibra's gain ({_pct(both)}), replication alone gives {_pct(rp / both)} and reordering alone "
                 f"{_pct(ro / both)}.")
    kind = "more than" if both > ro + rp + 1e-9 else "less than" if both < ro + rp - 1e-9 else "exactly"
    why = ("reordering balances the nodes, which lets in-node replication finish the job" if kind == "more than" else
           "they partly fix the same imbalance")
    return text + f" Together they gain {kind} the sum of their separate gains ({_pct(ro)} + {_pct(rp)}): {why}."


# ---- 04 reordering / 05 replication -------------------------------------------------------------------
def reorder_story(table: pd.DataFrame) -> str:
    s = table.groupby("policy")[["speedup_vs_megatron", "node_skewness", "cross_node_share", "migration_gb"]].mean()
    s = s.sort_values("speedup_vs_megatron", ascending=False)
    lines = [f"- {label(p)}: {r['speedup_vs_megatron']:.2f}x Megatron, node skewness {r['node_skewness']:.2f}, "
             f"{_pct(r['cross_node_share'])} of token-expert pairs cross nodes, {r['migration_gb']:.2f} GB migrated "
             f"per step" for p, r in s.iterrows() if p not in IDEALS]
    text = "Mean over workloads and steps:\n\n" + "\n".join(lines)
    if {"relibra", "relibra-lpt"} <= set(s.index):
        a, b = s.loc["relibra"], s.loc["relibra-lpt"]
        better = "faster" if a["speedup_vs_megatron"] >= b["speedup_vs_megatron"] else "slower"
        text += (f"\n\nThe annealing search is {better} than greedy LPT here ({a['speedup_vs_megatron']:.2f}x vs "
                 f"{b['speedup_vs_megatron']:.2f}x): its node skewness is {a['node_skewness']:.2f} vs "
                 f"{b['node_skewness']:.2f} and it sends {_pct(a['cross_node_share'])} vs {_pct(b['cross_node_share'])} "
                 f"of pairs across nodes.")
    if {"relibra-lpt", "relibra-replicate"} <= set(s.index):
        lpt, none = s.loc["relibra-lpt"], s.loc["relibra-replicate"]
        if abs(lpt["speedup_vs_megatron"] / none["speedup_vs_megatron"] - 1) < 0.005:
            text += (f" Greedy LPT placement runs as fast as no reordering at all ({lpt['speedup_vs_megatron']:.3f}x vs "
                     f"{none['speedup_vs_megatron']:.3f}x) although it moves homes (node skewness "
                     f"{lpt['node_skewness']:.2f} vs {none['node_skewness']:.2f}): what it changes, in-node replication "
                     "already fixed.")
    return text


def replication_story(table: pd.DataFrame, sweep: pd.DataFrame) -> str:
    s = table.groupby("policy")[["speedup_vs_megatron", "gpu_skewness", "replicas_per_gpu"]].mean()
    s = s.sort_values("speedup_vs_megatron", ascending=False)
    lines = [f"- {label(p)}: {r['speedup_vs_megatron']:.2f}x Megatron, GPU skewness {r['gpu_skewness']:.2f}, "
             f"{r['replicas_per_gpu']:.2f} replicas per GPU" for p, r in s.iterrows() if p not in IDEALS]
    sp = sweep.sort_values("spare_slots_per_gpu")
    lo, hi = sp.iloc[0], sp.iloc[-1]
    span = float(sp["speedup_vs_megatron"].max() - sp["speedup_vs_megatron"].min())
    text = "Mean over workloads:\n\n" + "\n".join(lines)
    text += (f"\n\nFrom {int(lo['spare_slots_per_gpu'])} to {int(hi['spare_slots_per_gpu'])} spare slots per GPU, "
             f"ReLibra's throughput moves from {lo['speedup_vs_megatron']:.3f}x to {hi['speedup_vs_megatron']:.3f}x "
             f"(spread {_pct(span / lo['speedup_vs_megatron'])}) and its skewness from {lo['skewness']:.3f} to "
             f"{hi['skewness']:.3f}, while the replica buffer grows from {_pct(lo['replica_memory_share_full_model'])} "
             f"to {_pct(hi['replica_memory_share_full_model'])} of the parameter memory.")
    if span / lo["speedup_vs_megatron"] < 0.01:
        text += " Extra slots barely matter here: the planner does not fill them (few experts are hot enough)."
    return text


# ---- 06 skewness / 07 overheads -----------------------------------------------------------------------
def skewness_story(table: pd.DataFrame) -> str:
    ep = table[table["sweep"] == "ep"].pivot_table(index="ep", columns="policy", values="skewness")
    out = []
    if len(ep) and "megatron" in ep:
        lo, hi = ep.index.min(), ep.index.max()
        out.append(f"Megatron's skewness grows from {ep.loc[lo, 'megatron']:.2f} at EP {lo} to "
                   f"{ep.loc[hi, 'megatron']:.2f} at EP {hi}: fewer experts per GPU let one hot expert weigh more.")
        if "relibra" in ep:
            out.append(f"ReLibra stays at {ep['relibra'].min():.2f}-{ep['relibra'].max():.2f} over the same range.")
    dom = table[table["sweep"] == "workload"].pivot_table(index="workload", columns="policy", values="skewness")
    if len(dom) and "megatron" in dom:
        w = dom["megatron"].idxmax()
        out.append(f"Across domains, {w} is the most skewed under Megatron ({dom.loc[w, 'megatron']:.2f}).")
    return " ".join(out)


def overheads_story(table: pd.DataFrame) -> str:
    out = []
    for _, r in table.iterrows():
        p = r["policy"]
        hidden = "on the critical path" if r["planner_on_critical_path"] else (
            "hidden behind one forward pass" if r["plan_s"] <= r["forward_s"] else "longer than one forward pass")
        out.append(f"- {label(p)}: plans a step in {1e3 * r['plan_s']:.1f} ms ({hidden}, forward "
                   f"{1e3 * r['forward_s']:.1f} ms); migration {_pct(r['migration_share'])} of the step; replica "
                   f"memory {_pct(r['replica_memory_share_full_model'])}"
                   + ("" if pd.isna(r["transfer_overlap"]) else f"; {_pct(r['transfer_overlap'])} of replica "
                      "transfers hidden") + ".")
    return "\n".join(out)


# ---- 08 runtime / 09 RL -------------------------------------------------------------------------------
def runtime_segments_story(segments: pd.DataFrame, waiting: str) -> str:
    """Per policy: the step's largest measured segments, the share spent waiting for the other ranks, and
    simulated / measured for each segment the simulator prices. segments: experiments.runtime.segment_frame
    rows (median over launches when several)."""
    g = segments.groupby(["policy", "segment", "source"], sort=False)["seconds"].median().unstack("source")
    out = []
    for policy in g.index.get_level_values("policy").unique():
        d = g.loc[policy]
        measured = d["measured"].dropna()
        step = measured.sum()
        wait = measured.get(waiting, 0.0)
        top = measured.drop(waiting, errors="ignore").sort_values(ascending=False).head(2)
        parts = [f"{name} {1e3 * v:.0f} ms" for name, v in top.items()]
        line = (f"- {label(policy)}: step {1e3 * step:.0f} ms (mean over ranks); largest own work: {', '.join(parts)}; "
                f"waiting for the other ranks {1e3 * wait:.0f} ms ({100 * wait / step:.0f}% of the step).")
        if "simulated" in d:
            both = d.dropna(subset=["measured", "simulated"])
            both = both[(both["measured"] > 0) & (both["simulated"] > 0)]
            if len(both):
                line += " Simulated / measured: " + ", ".join(
                    f"{name} {r['simulated'] / r['measured']:.2f}" for name, r in both.iterrows()) + "."
        out.append(line)
    return "\n".join(out)


def runtime_agreement(results: pd.DataFrame, step_tolerance: float = 0.15) -> str:
    """Measured vs simulated step time per policy, then each launch's speed-up over Megatron with its 95%
    interval and whether the simulated ratio lies inside it. results: experiments.runtime.summary_frame
    rows (one per policy and launch, `repeat` or `launch` numbering the launches). Refuses to judge
    oversubscribed runs."""
    g = results.groupby("policy").agg(measured=("step_s_median", "median"), sim=("sim_step_s", "median"),
                                      lo=("step_s_min", "min"), hi=("step_s_max", "max"))
    over = bool(results["oversubscribed"].any()) if "oversubscribed" in results else False
    lines = []
    for p, r in g.iterrows():
        ratio = r["sim"] / r["measured"]
        ok = abs(ratio - 1) <= step_tolerance
        lines.append(f"- {label(p)}: measured median {r['measured']:.3f} s (min {r['lo']:.3f}, max {r['hi']:.3f}), "
                     f"simulated {r['sim']:.3f} s: simulated / measured {ratio:.2f} "
                     + ("(within" if ok else "(outside") + f" {100 * step_tolerance:.0f}%)")
    text = "\n".join(lines)
    if over:
        return ("OVERSUBSCRIBED: more ranks than cores, so these wall-clock times measure the scheduler and say "
                "nothing about speed or about the simulator.\n\n" + text)
    launch = "repeat" if "repeat" in results else ("launch" if "launch" in results else None)
    if "speedup_ci_low" in results:
        for _, r in results[results["policy"] != "megatron"].iterrows():
            if pd.isna(r["speedup_ci_low"]):
                continue
            inside = r["speedup_ci_low"] <= r["sim_speedup_vs_megatron"] <= r["speedup_ci_high"]
            which = f"launch {int(r[launch]) + 1}, " if launch else ""
            text += (f"\n\n{which}{label(r['policy'])} vs Megatron: measured {r['speedup_vs_megatron']:.2f}x "
                     f"(95% interval {r['speedup_ci_low']:.2f}-{r['speedup_ci_high']:.2f}, width "
                     f"{r['speedup_ci_high'] - r['speedup_ci_low']:.2f}), simulated {r['sim_speedup_vs_megatron']:.2f}x, "
                     + ("inside" if inside else "outside") + " the interval.")
            if "cpu_speedup_ci_low" in results and not pd.isna(r["cpu_speedup_ci_low"]):
                text += (f" On process CPU time (the busiest rank per step) {r['cpu_speedup_vs_megatron']:.2f}x "
                         f"({r['cpu_speedup_ci_low']:.2f}-{r['cpu_speedup_ci_high']:.2f}).")
    steps_ok = all(abs(r["sim"] / r["measured"] - 1) <= step_tolerance for _, r in g.iterrows())
    text += ("\n\nOn these numbers the simulator " + ("agrees with" if steps_ok else "does not agree with")
             + f" the measured step times to {100 * step_tolerance:.0f}%.")
    return text


def reward_trend(rewards: pd.DataFrame) -> tuple[float, float]:
    """(change of the fitted line over the run, spread of the rewards around it: the residuals' std)."""
    steps, reward = rewards["step"].to_numpy(dtype=float), rewards["reward"].to_numpy(dtype=float)
    if len(reward) < 3:
        return float(reward[-1] - reward[0]), float("nan")
    slope, icpt = np.polyfit(steps, reward, 1)
    return float(slope * (steps[-1] - steps[0])), float(np.std(reward - (slope * steps + icpt), ddof=2))


def rl_story(rewards: pd.DataFrame, sim: pd.DataFrame) -> str:
    first, last = rewards["reward"].iloc[0], rewards["reward"].iloc[-1]
    change, spread = reward_trend(rewards)
    s = sim.set_index("policy")
    text = [f"Mean reward went from {first:.3f} at step {int(rewards['step'].iloc[0])} to {last:.3f} at step "
            f"{int(rewards['step'].iloc[-1])}."]
    if np.isnan(spread) or abs(change) < 2 * spread:
        text.append(f"That is no sign of learning: the fitted trend moves {change:+.3f} over the run, less than twice "
                    f"the rewards' spread around it ({spread:.3f}); the run is long enough to record real routing, "
                    "not to train the policy.")
    else:
        text.append(f"The fitted trend moves {change:+.3f} over the run, more than twice the rewards' spread around "
                    f"it ({spread:.3f}).")
    if "relibra" in s.index and "megatron" in s.index:
        text.append(f"On the recorded routing, ReLibra runs {s.loc['relibra', 'speedup_vs_megatron']:.2f}x Megatron "
                    f"(skewness {s.loc['relibra', 'skewness']:.2f} vs {s.loc['megatron', 'skewness']:.2f}).")
    for p in s.index:
        if p == "megatron" or p in IDEALS:
            continue
        r = s.loc[p]
        if r["skewness"] < s.loc["megatron", "skewness"] and r["speedup_vs_megatron"] < 1.0:
            text.append(f"{label(p)} is slower than Megatron ({r['speedup_vs_megatron']:.2f}x) although its skewness is "
                        f"lower ({r['skewness']:.2f}): {explain_gap(sim, p, 'megatron')}.")
    return " ".join(text)


# ---- 10 sensitivity -------------------------------------------------------------------------------------


def _slower_links(frame: pd.DataFrame) -> list[str]:
    """Why a slower link raises ReLibra / Megatron, said only where the rows show it."""
    out = []
    for knob in ("NVLink rate", "RDMA rate"):
        d = frame[frame["knob"] == knob]
        if d.empty or "relibra_over_megatron" not in d or d["value"].nunique() < 2:
            continue
        d = d.assign(rate=pd.to_numeric(d["value"], errors="coerce")).dropna(subset=["rate"]).sort_values("rate")
        slow, dflt = d.iloc[0], d[d["is_default"].astype(bool)]
        if len(dflt) and slow["relibra_over_megatron"] > float(dflt["relibra_over_megatron"].iloc[0]) + 1e-9:
            out.append(f"A slower {knob} ({knob_value(slow['value'])} GB/s) raises ReLibra / Megatron from "
                       f"{float(dflt['relibra_over_megatron'].iloc[0]):.3f} to {slow['relibra_over_megatron']:.3f}: the "
                       "all-to-all then takes a larger share of the step, and each all-to-all lasts as long as its "
                       "busiest receiver's transfer, which balancing makes shorter; so the slower the link, the more "
                       "Megatron's busiest GPU costs.")
    return out


def sensitivity_story(tornado: pd.DataFrame, frame: pd.DataFrame, flat: float = 0.005) -> str:
    """Which knob moves each ratio most (from what to what, at which values), the knobs that move none
    of them by more than `flat` (relative), and the knob values where ReLibra falls behind Megatron or
    EPLB+. tornado: relibra.experiments.sensitivity.tornado_table; frame: the sensitivity rows."""
    t = tornado.set_index(["ratio", "knob"])
    default = {r: float(tornado.loc[tornado["ratio"] == r, "default"].iloc[0]) for r in tornado["ratio"].unique()}
    out = []
    if {"relibra_over_megatron", "relibra_over_eplb_plus", "relibra_over_balanced_compute"} <= set(default):
        out.append(f"At the default set-up ReLibra runs {default['relibra_over_megatron']:.3f}x Megatron's "
                   f"throughput and {default['relibra_over_eplb_plus']:.3f}x EPLB+'s, and reaches "
                   f"{_pct(default['relibra_over_balanced_compute'])} of balanced-compute.")
    for ratio, name in RATIO_LABELS.items():
        d = tornado[tornado["ratio"] == ratio]
        if d.empty:
            continue
        top = d.iloc[0]  # tornado_table sorts by swing
        if top["swing"] <= flat * default[ratio]:
            out.append(f"- {name} barely moves with any knob here (largest swing {top['swing']:.4f}, {top['knob']}).")
            continue
        lead = f"The headline, {name}," if ratio == "relibra_over_megatron" else name
        line = (f"- {lead} moves most with **{top['knob']}**: from {top['low']:.3f} ({top['knob']} = "
                f"{knob_value(top['low_value'], top['knob'])}) to {top['high']:.3f} "
                f"({knob_value(top['high_value'], top['knob'])}), a swing of "
                f"{_pct(top['swing'] / default[ratio])} of its default")
        rest = d.iloc[1:3]
        rest = rest[rest["swing"] > flat * default[ratio]]
        if len(rest):
            line += "; then " + ", ".join(f"{r['knob']} ({r['low']:.3f}-{r['high']:.3f})" for _, r in rest.iterrows())
        out.append(line + ".")
    knobs = list(dict.fromkeys(tornado["knob"]))
    still = [k for k in knobs if all(t.loc[(r, k), "swing"] <= flat * default[r] for r in default if (r, k) in t.index)]
    if still:
        out.append(f"Knobs that move none of the three ratios by more than {_pct(flat)}: {', '.join(still)}.")
    out += _slower_links(frame)
    for ratio, rival in (("relibra_over_megatron", "Megatron"), ("relibra_over_eplb_plus", "EPLB+")):
        if ratio not in frame:
            continue
        moved = frame[~frame["is_default"].astype(bool)]
        if default[ratio] < 1.0:
            ahead = moved[moved[ratio] >= 1.0]
            cases = ", ".join(f"{r['knob']} = {knob_value(r['value'], r['knob'])} ({r[ratio]:.3f})" for _, r in ahead.iterrows())
            out.append(f"ReLibra is slower than {rival} at the default set-up ({default[ratio]:.3f}x); "
                       + (f"it gets ahead only at: {cases}." if cases else "no knob value tried puts it ahead."))
        else:
            behind = moved[moved[ratio] < 1.0]
            if len(behind):
                cases = ", ".join(f"{r['knob']} = {knob_value(r['value'], r['knob'])} ({r[ratio]:.3f})" for _, r in behind.iterrows())
                out.append(f"ReLibra falls behind {rival} at: {cases}.")
    return "\n\n".join(out)


def scale_story(table: pd.DataFrame, comparison: pd.DataFrame, planner_target_s: float = 2.0) -> str:
    """What notebook 11's sweep says: where ReLibra's in-node replication runs out of room (its
    fraction of balanced-compute at the largest EP per cluster), whether relibra-h wins there against
    the best other policy, the cases that could not run and the slowest planner step against
    `planner_target_s`. table: experiments.scale.scale_sweep; comparison: experiments.scale.best_other."""
    ok = table[table["status"] == "ok"]
    out = []
    for (model, cluster), g in ok.groupby(["model", "cluster"], sort=False):
        top = g[g["ep"] == g["ep"].max()].set_index("policy")
        if "relibra" not in top.index:
            continue
        ep = int(g["ep"].max())
        line = (f"- **{model} on {cluster}**, largest EP {ep}: ReLibra {top.loc['relibra', 'speedup_vs_megatron']:.3f}x "
                f"Megatron ({_pct(top.loc['relibra', 'frac_of_balanced_compute'])} of balanced-compute, skewness "
                f"{top.loc['relibra', 'skewness']:.2f})")
        if "relibra-h" in top.index:
            line += (f"; relibra-h {top.loc['relibra-h', 'speedup_vs_megatron']:.3f}x "
                     f"({_pct(top.loc['relibra-h', 'frac_of_balanced_compute'])}, skewness "
                     f"{top.loc['relibra-h', 'skewness']:.2f})")
        out.append(line + ".")
    if len(comparison):
        behind = comparison[comparison["over_best_other"] < 1.0 - 1e-9]
        if behind.empty:
            out.append(f"relibra-h is at least the best other policy in all {len(comparison)} cases.")
        else:
            worst = behind.loc[behind["over_best_other"].idxmin()]
            out.append(f"relibra-h trails the best other policy in {len(behind)} of {len(comparison)} cases; the "
                       f"largest gap is {worst['model']} on {worst['cluster']} at EP {int(worst['ep'])}, where "
                       f"{label(worst['best_other'])} is {_pct(1 / worst['over_best_other'] - 1)} faster.")
    skipped = table[table["status"] != "ok"]
    if len(skipped):
        out.append("Not possible and kept as rows: " + "; ".join(
            f"{r.model} on {r.cluster} at EP {r.ep} ({r.status.removeprefix('impossible: ')})"
            for r in skipped.itertuples()) + ".")
    planners = ok[ok["policy"].isin(("relibra", "relibra-h"))]
    if len(planners):
        slow = planners.loc[planners["plan_cpu_s"].idxmax()]
        verdict = "within" if slow["plan_cpu_s"] <= planner_target_s else "over"
        out.append(f"The slowest plan is {label(slow['policy'])} for {slow['model']} at EP {int(slow['ep'])}: "
                   f"{slow['plan_cpu_s']:.2f} CPU s for the simulated layers, {verdict} the {planner_target_s:g} s "
                   "a step's plan must stay under to hide behind the previous step (measured on this machine).")
    return "\n".join(out)
