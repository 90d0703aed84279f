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
# # 01 - Routing dynamics: why history-based balancing misses in RL
#
# **The question: how far do hot experts move from one micro-batch to the next, and how much of a
# micro-batch's load does a prediction from past steps put on the wrong experts?**
#
# Load balancers such as EPLB place experts (and replicas) from a **prediction** of expert load, usually
# a moving average of past steps. That works when load is steady. In RL post-training each micro-batch
# holds different prompts and responses, so hot experts can shift from one micro-batch to the next,
# while the whole-step total, summed over many sequences, moves more slowly.
#
# ReLibra builds on a fact of RL: *routing replay* records, during rollout, which experts every token
# chose, and replays them in training, so the exact load of every micro-batch is known **before** the
# training step. This notebook measures what that knowledge is worth on the kit's synthetic RL traces.
# No simulator is involved: every figure is a statistic of the routing traces themselves.

# %% tags=["parameters"]
profile = "laptop"  # tiny | laptop (default) | paper | gpu: sizes of the traces (see relibra.experiments.PROFILES)
model = None        # one model preset (None: the profile's)
workload = None     # math | science | instruct | code | mixed, or several: "math,code" (None: the profile's)
ep = None           # expert-parallel size: ranks the trace routes from (None: the profile's)
steps = None        # training steps per trace (None: the profile's)
seed = 0            # same seed, same traces
out_dir = None      # default: results/interactive/01_routing_dynamics

# %%
from relibra import experiments as ex, plots

run = ex.start("01_routing_dynamics", globals())  # unknown or out-of-range parameters fail here
p, sizes = run.params, run.sizes
print(run.scale_note())
result = run.compute()
label = f"{p.trace_label(sizes)} | workloads {', '.join(result.traces)}"

# %% [markdown]
# ## How far hot experts shift
#
# *Hot-expert overlap*: the share of one load vector's hottest 10% of experts that are also among the
# other's hottest 10% (1 = the same hot set). *Load correlation*: Pearson correlation of the two load
# vectors. The history prediction is the moving average of up to 4 previous whole steps.

# %%
shift = result.shift_stats
fig = plots.shift_bars(shift, label)
run.save_figure(fig, "shift", "Hot-expert overlap and load correlation between micro-batches, steps and a "
                f"history prediction, per workload - {label}", source="synthetic",
                hardware="the kit's RL trace generator")

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
# ## 1. Expert load, micro-batch by micro-batch
#
# Left: the share of token-slots each expert of one MoE layer receives in every micro-batch of step 0.
# Right: the same layer summed over each whole step.

# %%
fig = plots.expert_load_heatmaps(result.expert_load, p.trace_label(sizes))
run.save_figure(fig, "expert_load_heatmaps", "Share of token-slots per expert, per micro-batch (left) and per "
                f"whole step (right), MoE layer 0 - {p.trace_label(sizes)}", source="synthetic",
                hardware="the kit's RL trace generator")

# %% [markdown]
# ## 2. How wrong a prediction is
#
# The error is the share of token-slots a prediction puts on the wrong experts (total-variation distance
# between load shares). EPLB sees the history; EPLB+ is given the exact whole-step load; only replay
# knows each micro-batch.

# %%
errors = result.prediction_error
fig = plots.prediction_error_plot(errors, label)
run.save_figure(fig, "prediction_error", "Share of token-slots predicted on the wrong experts: history vs oracle "
                f"step load, against whole steps and single micro-batches - {label}", source="synthetic",
                hardware="the kit's RL trace generator")
errors.groupby(["predictor", "target"])["error"].describe().sort_values("mean", ascending=False).round(3)

# %% [markdown]
# ## 3. What static placement makes of it
#
# Rank skewness under Megatron's static contiguous placement, for every micro-batch and layer, and for
# the whole step (counted from the trace's tokens per EP rank; no cost model).

# %%
fig = plots.static_skewness_plot(result.static_skewness, label)
run.save_figure(fig, "static_skewness", f"Rank skewness (max / mean tokens per GPU) under static placement - {label}",
                source="synthetic", hardware="the kit's RL trace generator")

# %% [markdown]
# The comparisons' values per workload, the comparisons whose hot sets overlap least first:

# %%
shift.pivot_table(index="comparison", columns=["metric", "trace"], values="value").sort_values(
    ("hot-expert overlap", shift["trace"].iloc[0])).round(3)

# %%
run.finish()
print("figures:", [f["name"] for f in run.figures])
