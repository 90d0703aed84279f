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
# # 11 - Beyond the paper's scale: EP16 to EP256, three model sizes, two cluster kinds
#
# **The question: where does in-node replication run out of room as EP grows, and do cross-node
# replicas (`relibra-h`) win it back?**
#
# The paper stops at EP32 with 128-expert models on 8-GPU nodes. Here the same policies run from
# EP16 to EP256 on:
#
# * three model sizes: Qwen3-30B-A3B and Qwen3-235B-A22B (128 experts) and DeepSeek-V3 (256 experts,
#   MLA approximated as docs/scale.md says);
# * two cluster kinds: 8-GPU Hopper nodes joined by RDMA (`paper,nodes=32`, 256 GPUs), and four GB200
#   NVL72 racks (`gb200-nvl72x4`), where one NVLink domain holds up to 72 GPUs.
#
# What to look for. ReLibra replicates hot experts only **inside a node**. With 8 GPUs per node, a
# node is 1/32 of an EP256 group: when a micro-batch's hot experts crowd into one node, in-node
# replication cannot bring that node down to the global mean. `relibra-h` adds replicas across
# nodes where the cost model's rates say the RDMA push hides behind attention or pays for itself.
# On NVL72 the node is the rack, so plain ReLibra has room.
#
# Throughput is **simulated** (`relibra.sim`) on synthetic RL traces; planner seconds are
# **measured** on this machine, one core.

# %% tags=["parameters"]
profile = "laptop"  # tiny | laptop (default) | paper | gpu: sets the grid's layers and micro-batches
models = None       # comma-separated model presets (default: the profile's three sizes)
clusters = None     # cluster presets or specs separated by semicolons (default: 32 paper nodes and gb200-nvl72x4)
eps = None          # comma-separated EP sizes (default: 16,32,64,128,256)
workload = None     # math | science | instruct | code | mixed
policies = None     # default: megatron,eplb+,llep,relibra,relibra-h
seed = 0            # same seed, same numbers
out_dir = None      # default: results/interactive/11_scale

# %%
from relibra import experiments as ex, plots

run = ex.start("11_scale", globals())  # unknown or out-of-range parameters fail here
p, sweep = run.params, run.sizes
print(f"{p.profile} profile: first {sweep.layers or 'all'} MoE layers, {sweep.micro_batches} micro-batches, "
      f"workload {p.the_workload()}, seed {p.seed}")
print("models:", ex.text.model_differences(p.models))

# %%
result = run.compute()
table, comparison = result.scale, result.relibra_h_vs_best

# %% [markdown]
# ## Throughput over Megatron against EP
#
# Each panel is one model on one cluster; the dashed line is balanced-compute, the ceiling no
# placement can pass (the real routing and its all-to-all, every GPU at the mean expert compute).

# %%
subtitle = (f"simulated, workload {p.the_workload()}, first {sweep.layers or 'all'} MoE layers, {sweep.micro_batches} "
            f"micro-batches, seed {p.seed}")
fig = plots.ep_sweep_plot(table, subtitle)
clusters = [c.name for c in p.clusters]
run.save_figure(fig, "ep_sweep", f"Simulated tokens/s over Megatron from EP{min(p.eps)} to "
                f"EP{max(p.eps)} for {', '.join(m.name for m in p.models)} on "
                f"{'; '.join(plots.cluster_label(c) for c in clusters)}; dashed: balanced-compute - {subtitle}",
                source="simulated", hardware=", ".join(clusters))

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
# ## The sweep
#
# One row per (model, cluster, EP), one column per policy, sorted by mean speed-up over Megatron
# (the simulator's `balanced` and `balanced-compute` references included). A case that cannot exist
# (EP256 of a 128-expert model) is a row of the CSV that says why.

# %%
plots.ratio_pivot(table).round(3)

# %% [markdown]
# ## relibra-h against the best other policy

# %%
comparison.round(3)

# %% [markdown]
# ## Planner time
#
# CPU seconds of one whole step's plan, measured here on one core, for the simulated layers. A
# step's plan must hide behind the previous training step; at the paper's scale that step takes
# seconds.

# %%
fig = plots.scale_planner_plot(table, f"measured on {ex.this_machine()}, first {sweep.layers or 'all'} MoE layers, "
                               f"{sweep.micro_batches} micro-batches, workload {p.the_workload()}, seed {p.seed}")
run.save_figure(fig, "planner_time", "Measured planner CPU seconds per step against EP (one core of this machine)",
                source="measured", hardware=ex.this_machine())
plots.ratio_pivot(table, "plan_cpu_s").round(3)

# %%
run.finish()
print("figures:", [f["name"] for f in run.figures])
