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
# Reordering decides, once per step, which GPU is home to each expert. Since replicas stay inside a
# node, the placement must first balance the **nodes**; it should also keep tokens inside their node,
# because cross-node (RDMA) bandwidth is ~9x lower than NVLink on the paper's cluster.
#
# Compared here, all followed by the same intra-node replication:
# * `relibra` - ReLibra's swap-based simulated annealing, scoring node and GPU balance with
#   inter-node dispatch bytes;
# * `relibra-lpt` - greedy longest-processing-time placement of each step's loads;
# * `relibra-replicate` - no reordering (static homes).
#
# Figures: simulated throughput, node-level skewness (max / mean tokens per node), the share of
# dispatched tokens that cross nodes, and migration: bytes moved per step when homes change.

# %% tags=["parameters"]
profile = "laptop"  # tiny | laptop (default) | paper | gpu (see relibra.experiments.PROFILES)
model = None        # one model preset (None: the profile's)
workload = None     # math | science | instruct | code | mixed, or several: "math,code"
ep = None           # expert-parallel size
cluster = None      # cluster preset: paper | h800 | nvl72 | cpu-gloo
policies = None     # comma-separated policy names (None: this notebook's set)
steps = None        # training steps per routing trace
seed = 0            # same seed, same numbers
out_dir = None      # default: results/04_reordering

# %%
from relibra import experiments as ex, plots
from relibra.experiments import narrative as nr

run = ex.start("04_reordering", globals())  # unknown or out-of-range parameters fail here
cfg = run.config
print(cfg.scale_note())

# %%
result = run.compute()
table = result.reordering
table.groupby("policy")[["speedup_vs_megatron", "node_skewness", "gpu_skewness", "cross_node_share",
                         "migration_gb"]].mean().round(3)

# %%
fig = plots.reorder_plot(table, cfg.sim_subtitle())
run.save_figure(fig, "reordering", "Annealing search vs greedy LPT vs no reordering: simulated throughput, node "
                "skewness, cross-node token share and migration per step")

# %% [markdown]
# ## What the numbers say

# %%
nr.show(run.story(result))
run.finish()
print("figures:", [f["name"] for f in run.figures])
