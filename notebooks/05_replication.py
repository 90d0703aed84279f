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
# # 05 - Intra-batch replication: joint replication vs reordering only vs splitting only
#
# **The question: does deciding replicas and token splits jointly, per micro-batch, balance GPUs
# better than no replicas or a fixed set of replicas, and how many spare slots per GPU are worth
# their memory?**
#
# Inside a node, ReLibra decides per micro-batch and layer **which** hot experts get a copy in which
# spare slot **and** how to split their tokens, jointly (an incremental greedy heuristic for the MILP).
# Compared here, on the same reordered homes:
#
# * `relibra` - joint replica placement and token split;
# * `relibra-reorder` - reordering only: the same homes, no replicas;
# * `relibra-split` - splitting only: a fixed set of replicas chosen once per step, tokens re-split per
#   micro-batch;
# * `megatron` - static homes and no replication, the reference of the speed-ups.
#
# Numbers are **simulated** on the cluster preset named under each figure.

# %% tags=["parameters"]
profile = "laptop"  # tiny | laptop (default) | paper | gpu (see relibra.experiments.PROFILES)
model = None        # one model preset (None: the profile's)
workload = None     # math | science | instruct | code | mixed, or several: "math,code"
ep = None           # expert-parallel size
cluster = None      # cluster preset: paper | h800 | nvl72 | cpu-gloo
trace = None        # a routing trace file (.npz) the kit wrote, studied instead of synthetic traces
policies = None     # comma-separated policy names (None: this notebook's set)
steps = None        # training steps per routing trace
seed = 0            # same seed, same numbers
out_dir = None      # default: results/interactive/05_replication
spare_slot_counts = "1,2,3,4"  # spare replica slots per GPU swept in section 2

# %%
from relibra import experiments as ex, plots

run = ex.start("05_replication", globals())  # unknown or out-of-range parameters fail here
p, sizes = run.params, run.sizes
print(run.scale_note())
result = run.compute()
table = result.replication

# %% [markdown]
# ## 1. Joint replication against reordering only and splitting only
#
# Per workload and policy: simulated throughput over Megatron's, GPU skewness (max / mean tokens per
# GPU of each micro-batch and layer) and the replicas each GPU holds.

# %%
fig = plots.replication_plot(table, p.sim_subtitle(sizes))
run.save_figure(fig, "replication", "Joint replication vs reordering only vs splitting only: simulated throughput, "
                f"per-micro-batch GPU skewness and replicas per GPU - {p.sim_subtitle(sizes)}")

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
# The means over workloads, policies sorted by speed-up (fastest first):

# %%
table.groupby("policy")[["speedup_vs_megatron", "gpu_skewness", "replicas_per_gpu"]].mean().sort_values(
    "speedup_vs_megatron", ascending=False).round(3)

# %% [markdown]
# ## 2. How many spare slots are worth it
#
# ReLibra with each count of `spare_slot_counts` spare replica slots per GPU on the first workload
# (the kit's default is circled). Each point is labelled with its value: the differences can be small.

# %%
sweep = result.spare_slots
subtitle = p.one_case_subtitle(sizes)
fig = plots.spare_slot_plot(sweep, subtitle)
run.save_figure(fig, "spare_slots", "Simulated ReLibra throughput, GPU skewness and replica memory vs spare "
                f"replica slots per GPU - {subtitle}")
sweep

# %%
run.finish()
print("figures:", [f["name"] for f in run.figures])
