# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 - The headline: does ReLibra deliver what the paper claims?
#
# The paper's abstract: ReLibra trains up to **1.6x** faster than Megatron-LM, up to **1.2x** faster
# than EPLB even when EPLB is given the exact loads (EPLB+), and within **6-10%** of a balanced ideal.
# This notebook answers with the kit's figures at **full scale** (every MoE layer, every micro-batch of
# the paper's 1024-sequence batch, EP 32 on 20 x 8 Hopper GPUs) over several seeds, on the set-up
# card (`relibra setup show token-budget-tp1`): every input sourced, the batch packed into token-budget
# micro-batches as slime and verl pack it. Every number is **simulated** (`relibra.sim`) on synthetic
# RL routing traces; the `tiny` profile (tests) runs a toy grid instead and says so in every caption.
#
# **Your own routing.** Give `trace` a routing trace file the kit wrote (`relibra trace import` of a
# Megatron RouterReplay dump, verl, SGLang, vLLM or slime; the generator; `relibra rl`): the grid is
# then that trace's one case (its model, EP size, steps and micro-batches; every policy on its last
# step, the steps before it as history), the verdict, ratios and overheads are that case's, and every
# caption names the file and where it came from. `cluster` (a preset such as `h800`, a fitted `.json`
# or `nodes=4,gpus=8,...` items) runs every case on that cluster instead of the card's; the EP size
# must fit it.
#
# Policies (`relibra.policies`, docs/policies.md): `megatron` static placement; `eplb` EPLB on past
# loads; `eplb+` EPLB on this step's exact loads; `lplb+` LPLB's linear program on exact loads;
# `eplb+lp` EPLB+'s copies with an LP token split; `llep` least-loaded EP; `relibra` and its ablations;
# `relibra-h` (cross-node replicas); `balanced` (routing forced uniform, the paper's ideal) and
# `balanced-compute` (the real routing with every GPU at the mean expert compute).

# %% tags=["parameters"]
profile = "laptop"  # tiny | laptop (default) | paper | gpu: the headline is full scale in all but tiny
setup = "token-budget-tp1"     # set-up card: token-budget-tp1 | paper-stated | one-sequence | a .toml path (relibra setup list)
tokens_per_microbatch = None  # token budget per GPU per micro-batch instead of the card's (e.g. 4096)
trace = None        # a routing trace file (.npz) the kit wrote, simulated instead of the synthetic grid
cluster = None      # a cluster preset (h800, nvl72, ...), a fitted .json or a spec string (None: the card cluster)
out_dir = None      # default: results/interactive/02_throughput

# %%
from relibra import experiments as ex, plots
from relibra.plots import headline as hplots

run = ex.start("02_throughput", globals())  # unknown or out-of-range parameters fail here

# %%
result = run.compute()  # the grid, the budget sweep and the alternatives, in worker processes (one per core)
caption = result.caption
print(caption)

# %%
fig = hplots.headline_cases_plot(result.case_ratios, caption)
run.save_figure(fig, "headline_cases", f"ReLibra / Megatron and ReLibra / EPLB+ per model and workload, mean and "
                f"range over seeds; {caption}")

# %% [markdown]
# ### What to notice

# %%
ex.show(run.story(result))

# %% [markdown]
# ### Try this
#
# Each suggestion says which way the result moves; `tests/test_lessons.py` makes exactly that change
# (at the tiny profile) and checks the direction.

# %%
ex.show(run.try_this())

# %% [markdown]
# ## The verdict, claim by claim
#
# `mean`, `low`, `high`: over every model, workload and seed; `best_case` names the "up to";
# `seeds_of_best_*`: the same model and workload over the seeds; `alternatives_*`: the other batch
# layouts and link rates on one case (the sweep below).

# %%
result.verdict.drop(columns=["why"])

# %% [markdown]
# ## What the layout does: the ratios against the tokens per micro-batch
#
# The same model and workload with the batch packed to budgets of 4k-32k tokens per GPU (blue), and
# laid out one whole sequence per (micro-batch, rank) with sequences scaled to the same mean (red).
# Below it, the headline ratios under the other batch layouts and link-rate measurements. On a
# `trace` the sweep and the other layouts are left empty: both reshape the generator's synthetic
# batch, and a recorded trace fixes its own micro-batches and sequences; the link-rate alternatives
# do run on the trace.

# %%
fig = hplots.budget_plot(result.ratio_vs_budget, result.sweep_caption)
run.save_figure(fig, "ratio_vs_budget", f"ReLibra / Megatron and ReLibra / EPLB+ against tokens per micro-batch, "
                f"token-budget packing and one sequence per micro-batch; {result.sweep_caption}")
result.alternatives.round(3)

# %% [markdown]
# ## Every policy, normalized to Megatron (mean over seeds)

# %%
mean = result.throughput.groupby(["model", "workload", "policy"], sort=False, as_index=False).mean(numeric_only=True)
fig = plots.throughput_bars(mean, caption)
run.save_figure(fig, "throughput_normalized", f"Simulated training throughput normalized to Megatron, per model, "
                f"workload and policy, mean over seeds; {caption}")
fig = plots.fraction_of_balanced(mean, caption)
run.save_figure(fig, "fraction_of_balanced", f"Simulated throughput as a fraction of the balanced ideal over models "
                f"and workloads, mean over seeds; {caption}")

# %% [markdown]
# ## ReLibra's overheads beside the paper's

# %%
result.overheads

# %% [markdown]
# The throughput ratios per (model, workload), policies sorted by their mean speed-up (fastest first):

# %%
ex.text.ranked(mean, ["model", "workload"], "speedup_vs_megatron").round(3)

# %%
run.finish()
print("figures:", [f["name"] for f in run.figures])
