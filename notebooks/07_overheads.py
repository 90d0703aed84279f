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
# # 07 - Overheads: planner time, migration, replica memory, transfer overlap
#
# **The question: what does each policy pay for its balance, in planner time, migrated weights,
# replica memory and exposed replica transfers, and does the planner hide behind work the RL
# pipeline does anyway?**
#
# * **planner time** per step, measured here on one CPU core, against the time it must hide behind.
#   With routing replay the step's routing is known after rollout, and the planner runs while the RL
#   pipeline computes log-probabilities of the rollout (a forward pass over the same batch). We take
#   the simulated forward time of one training step as that window. Policies that plan per
#   micro-batch at run time (LLEP) cannot hide it.
# * **migration share**: reordering moves expert weights and optimizer state across nodes; its
#   simulated time as a share of the step (paper: 1.4-2.1%).
# * **replica memory**: the replica buffer as a share of one GPU's parameter memory, counted against
#   the whole model (all its MoE layers) even when the profile simulates fewer (paper: 0.13-1.62%).
# * **transfer overlap**: the share of replica weight pushes and gradient pulls hidden behind attention.
#
# Planner times are **measured** (this machine, wall clock); the rest is **simulated**.

# %% tags=["parameters"]
profile = "laptop"  # tiny | laptop (default) | paper | gpu (see relibra.experiments.PROFILES)
model = None        # one model preset (None: the profile's)
workload = None     # math | science | instruct | code | mixed, or several: "math,code"
ep = None           # expert-parallel size
cluster = None      # cluster preset: paper | h800 | nvl72 | cpu-gloo
policies = None     # comma-separated policy names (None: this notebook's set)
steps = None        # training steps per routing trace
seed = 0            # same seed, same numbers
out_dir = None      # default: results/interactive/07_overheads

# %%
from relibra import experiments as ex, plots

run = ex.start("07_overheads", globals())  # unknown or out-of-range parameters fail here
p, sizes = run.params, run.sizes
print(run.scale_note())
result = run.compute()
table = result.overheads

# %%
fig = plots.planner_time_plot(table, p.sim_subtitle(sizes))
run.save_figure(fig, "planner_time", "Planner wall time per step (measured on this CPU) next to the simulated "
                f"forward-pass window it hides behind - {p.sim_subtitle(sizes)}", source="measured",
                hardware=ex.this_machine())

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
# ## Migration, replica memory and transfer overlap

# %%
fig = plots.overhead_bars(table, p.sim_subtitle(sizes))
run.save_figure(fig, "overheads", "Simulated migration share of step time, replica memory share and transfer "
                f"overlap per policy - {p.sim_subtitle(sizes)}")
table.sort_values("plan_s").round(4)

# %%
run.finish()
print("figures:", [f["name"] for f in run.figures])
