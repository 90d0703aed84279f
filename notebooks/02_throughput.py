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
# # 02 - End-to-end training throughput: models x workloads x policies
#
# **The question: how much faster does each balancing policy train than Megatron-LM's static
# placement, per model and RL workload, and how close does it get to a perfectly balanced layer?**
#
# This is the paper's main result: training throughput (tokens per second) of three MoE models on five
# RL workloads under every balancing policy, normalized to Megatron's. Policies (see
# `relibra.policies` and docs/policies.md for where each comes from):
#
# * `megatron` - static contiguous placement, no replicas;
# * `eplb` - DeepSeek's EPLB fed with a moving average of past steps' loads (what it can know in practice);
# * `eplb+` - EPLB given this step's exact loads (an oracle);
# * `lplb+` - EPLB+'s replicas plus a linear program per micro-batch that moves tokens among them;
# * `eplb+lp` - EPLB+'s replicas with an LP token split once per step;
# * `llep` - least-loaded expert parallelism: spills overloaded experts to any GPU, weights moved on the critical path;
# * `relibra` - inter-batch reordering across nodes + intra-batch replication inside nodes, from replayed routing;
# * `balanced` - an ideal, not a system: routing forced uniform, so every GPU gets the mean load;
# * `balanced-compute` - an ideal: the real routing and its all-to-all, but every GPU's expert compute
#   set to the mean (the best any placement of these tokens could reach).
#
# Every policy is priced by the same cost model (`relibra.sim`) on the same trace; the numbers are
# **simulated**, for the cluster preset, EP size, models, workloads and scale named under each figure.

# %% tags=["parameters"]
profile = "laptop"  # tiny | laptop (default) | paper | gpu (see relibra.experiments.PROFILES)
model = None        # model preset, or several for the grid: "qwen3-30b-a3b,glm-4.5-air,qwen3-235b-a22b"
workload = None     # math | science | instruct | code | mixed, or several: "math,code"
ep = None           # expert-parallel size (GPUs in one EP group)
cluster = None      # cluster preset: paper | h800 | nvl72 | cpu-gloo (see relibra.cluster)
policies = None     # comma-separated policy names, e.g. "megatron,eplb+,relibra"
steps = None        # training steps per routing trace (the first only gives EPLB its history)
seed = 0            # same seed, same numbers
out_dir = None      # default: results/02_throughput

# %%
from relibra import experiments as ex, plots
from relibra.experiments import narrative as nr

run = ex.start("02_throughput", globals())  # unknown or out-of-range parameters fail here
cfg = run.config
print(cfg.scale_note())
print("models:", nr.model_differences(cfg.models))
result = run.compute()
table = result.throughput

# %% [markdown]
# ## Throughput over Megatron's
#
# One panel per model (its title says how it differs from the others); one row per policy, sorted by
# its mean speed-up; the large marker is the mean over workloads, each small dot one workload. The
# axis spans the data, so a difference of one percent is visible; the line at 1.0 is Megatron.

# %%
fig = plots.throughput_bars(table, cfg.sim_subtitle())
run.save_figure(fig, "throughput_normalized", "Simulated training throughput over Megatron's per model and policy "
                f"(mean over workloads, and each workload) - {cfg.sim_subtitle()}")

# %% [markdown]
# ### What to notice

# %%
nr.show(run.story(result))

# %% [markdown]
# ### Try this
#
# Each suggestion says which way the result moves; `tests/test_lessons.py` makes exactly that change
# (at the tiny profile) and checks the direction.

# %%
nr.show(run.try_this())

# %% [markdown]
# ## Fraction of the balanced ideal
#
# The same runs against `balanced` (uniform routing): one row per system, sorted by its mean, one dot
# per (model, workload), the model as the dot's shape.

# %%
fig = plots.fraction_of_balanced(table, cfg.sim_subtitle())
run.save_figure(fig, "fraction_of_balanced", "Simulated throughput as a fraction of the balanced ideal (mean over "
                f"models and workloads, and each case) - {cfg.sim_subtitle()}")

# %% [markdown]
# ## Headline ratios next to the paper's
#
# The paper's abstract: ReLibra up to 1.6x over Megatron-LM, up to 1.2x over EPLB+ and within 6-10% of
# Balanced. The same ratios from this run:

# %%
result.headline_ratios

# %% [markdown]
# The throughput ratios per (model, workload), policies sorted by their mean speed-up (fastest first):

# %%
nr.ranked(table, ["model", "workload"], "speedup_vs_megatron").round(3)

# %%
run.finish()
print("figures:", [f["name"] for f in run.figures])
