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
# # 03 - Ablation: what reordering and replication each contribute
#
# **The question: how much of ReLibra's speed-up comes from moving expert homes across nodes, how
# much from copying hot experts inside nodes, and do the two add up?**
#
# Starting from Megatron's static placement:
#
# * **+ reordering** (`relibra-reorder`): once per step, move expert homes across nodes so the step's
#   load is balanced across nodes and GPUs. Cheap (once per step) but blind to each micro-batch.
# * **+ replication** (`relibra-replicate`, on static homes): per micro-batch, copy hot experts into
#   spare slots of other GPUs of the same node and split their tokens. Follows each micro-batch, but
#   cannot move load between nodes.
# * **both** (`relibra`): reordering balances the nodes, replication the GPUs inside them.
#
# Balanced (uniform routing) is the ideal. Numbers are **simulated** on the cluster preset named
# under the figure.

# %% tags=["parameters"]
profile = "laptop"  # tiny | laptop (default) | paper | gpu (see relibra.experiments.PROFILES)
model = None        # model preset, or several: "qwen3-30b-a3b,qwen3-235b-a22b"
workload = None     # math | science | instruct | code | mixed, or several
ep = None           # expert-parallel size
cluster = None      # cluster preset: paper | h800 | nvl72 | cpu-gloo
policies = None     # default: megatron, relibra-reorder, relibra-replicate, relibra, balanced
steps = None        # training steps per routing trace
seed = 0            # same seed, same numbers
out_dir = None      # default: results/interactive/03_ablation

# %%
from relibra import experiments as ex, plots

run = ex.start("03_ablation", globals())  # unknown or out-of-range parameters fail here
p, sizes = run.params, run.sizes
print(run.scale_note())
print("models:", ex.text.model_differences(p.models()))
result = run.compute()
table = result.ablation

# %% [markdown]
# ## Adding one mechanism at a time
#
# Left: throughput over Megatron's; right: rank skewness (max / mean tokens per GPU). Bars are the
# mean over workloads, whiskers their range, one shade of grey per model.

# %%
fig = plots.ablation_plot(table, p.sim_subtitle(sizes))
run.save_figure(fig, "ablation", "Simulated throughput (normalized to Megatron) and rank skewness as the "
                f"mechanisms are added; bars: mean over workloads, whiskers: range - {p.sim_subtitle(sizes)}")

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
# Speed-up over Megatron per model, stages sorted by their mean (fastest first):

# %%
ex.text.ranked(table, "model", "speedup_vs_megatron").round(3)

# %%
run.finish()
print("figures:", [f["name"] for f in run.figures])
