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
# # 04 - Inter-batch reordering: annealing search vs greedy LPT vs none
#
# **The question: does choosing expert homes by annealing search balance the nodes better than a
# greedy longest-processing-time placement, or than leaving homes static, and what does it cost in
# migrated weights?**
#
# Reordering decides, once per step, which GPU is home to each expert. Since replicas stay inside a
# node, the placement must first balance the **nodes**; it should also keep tokens inside their node,
# because cross-node (RDMA) bandwidth is several times lower than NVLink on the paper's cluster.
# Compared here, all followed by the same intra-node replication:
#
# * `relibra` - ReLibra's swap-based simulated annealing, scoring node and GPU balance with
#   inter-node dispatch bytes;
# * `relibra-lpt` - greedy longest-processing-time placement of each step's loads;
# * `relibra-replicate` - no reordering (static homes);
# * `megatron` - static homes and no replication, the reference of the speed-ups.
#
# Numbers are **simulated** on the cluster preset named under the figure.

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
out_dir = None      # default: results/interactive/04_reordering

# %%
from relibra import experiments as ex, plots

run = ex.start("04_reordering", globals())  # unknown or out-of-range parameters fail here
p, sizes = run.params, run.sizes
print(run.scale_note())
result = run.compute()
table = result.reordering

# %% [markdown]
# ## Throughput, node balance, cross-node traffic and migration
#
# Per workload and policy: simulated throughput over Megatron's, node skewness (max / mean tokens per
# node), the share of token-expert pairs that cross nodes, and the GB migrated per step when homes
# change. Bars are the mean over steps, whiskers their range.

# %%
fig = plots.reorder_plot(table, p.sim_subtitle(sizes))
run.save_figure(fig, "reordering", "Annealing search vs greedy LPT vs no reordering: simulated throughput, node "
                f"skewness, cross-node token share and migration per step - {p.sim_subtitle(sizes)}")

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
# ## The numbers
#
# Means over workloads and steps, policies sorted by speed-up (fastest first):

# %%
table.groupby("policy")[["speedup_vs_megatron", "node_skewness", "gpu_skewness", "cross_node_share",
                         "migration_gb"]].mean().sort_values("speedup_vs_megatron", ascending=False).round(3)

# %%
run.finish()
print("figures:", [f["name"] for f in run.figures])
