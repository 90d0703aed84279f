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
# # 05 - Intra-batch replication: joint replication vs placement-only vs splitting-only
#
# Inside a node, ReLibra decides per micro-batch and layer **which** hot experts get a copy in which
# spare slot **and** how to split their tokens, jointly (an incremental greedy heuristic for the MILP).
# Compared here, on the same reordered homes:
#
# * `relibra` - joint replica placement and token split;
# * `relibra-reorder` - placement only (reordering, no replicas);
# * `relibra-split` - splitting only: a fixed set of replicas chosen once per step, tokens re-split per micro-batch.
#
# Then the effect of the number of spare replica slots per GPU on ReLibra (the memory it costs is in
# notebook 07). Numbers are **simulated**.

# %% tags=["parameters"]
profile = "laptop"  # tiny | laptop (default) | paper | gpu (see relibra.experiments.PROFILES)
model = None        # one model preset (None: the profile's)
workload = None     # math | science | instruct | code | mixed, or several: "math,code"
ep = None           # expert-parallel size
cluster = None      # cluster preset: paper | h800 | nvl72 | cpu-gloo
policies = None     # comma-separated policy names (None: this notebook's set)
steps = None        # training steps per routing trace
seed = 0            # same seed, same numbers
out_dir = None      # default: results/05_replication
spare_slot_counts = "1,2,3,4"  # spare replica slots per GPU swept in section 2

# %%
from relibra import experiments as ex, plots
from relibra.experiments import narrative as nr

run = ex.start("05_replication", globals())  # unknown or out-of-range parameters fail here
cfg = run.config
print(cfg.scale_note())

# %%
result = run.compute()
table = result.replication
table.groupby("policy")[["speedup_vs_megatron", "gpu_skewness", "replicas_per_gpu"]].mean().round(3)

# %%
fig = plots.replication_plot(table, cfg.sim_subtitle())
run.save_figure(fig, "replication", "Joint replication vs placement-only vs splitting-only: simulated throughput "
                "and per-micro-batch GPU skewness")

# %% [markdown]
# ## 2. How many spare slots are worth it
#
# ReLibra with each count of `spare_slot_counts` spare replica slots per GPU (the kit's default is
# circled). Each point is labelled with its value: the differences can be small.

# %%
sweep = result.spare_slots
fig = plots.spare_slot_plot(sweep, cfg.sim_subtitle())
run.save_figure(fig, "spare_slots", "Simulated ReLibra throughput and GPU skewness vs spare replica slots per GPU")
sweep

# %% [markdown]
# ## What the numbers say

# %%
nr.show(run.story(result))
run.finish()
print("figures:", [f["name"] for f in run.figures])
