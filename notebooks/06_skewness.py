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
# # 06 - Rank skewness per policy, across EP sizes and task domains
#
# **The question: how far above the mean is each micro-batch's busiest GPU under each policy, and
# how does that grow with the EP size and change across task domains?**
#
# Rank skewness = max tokens per GPU / mean tokens per GPU, averaged over micro-batches and layers. The
# paper reports Megatron above 2.0, growing with EP: more GPUs per EP group means fewer experts per GPU,
# so one hot expert weighs more. Left: the EP sizes of `ep_sizes` on one workload. Right: each task
# domain at `ep`. Computed from each policy's plans (tokens per GPU), so no cost model is involved; the
# traces are synthetic.

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
out_dir = None      # default: results/interactive/06_skewness
ep_sizes = None     # EP sizes of the sweep, e.g. "8,16,32,64" (None: the profile's)

# %%
from relibra import experiments as ex, plots

run = ex.start("06_skewness", globals())  # unknown or out-of-range parameters fail here
p, sizes = run.params, run.sizes
print(run.scale_note())
result = run.compute()
table = result.skewness

# %%
label = p.plan_label(sizes, ep=",".join(str(e) for e in p.ep_sizes))
fig = plots.skewness_plot(table, label)
run.save_figure(fig, "skewness", f"Mean rank skewness per policy across EP sizes and task domains - {label}",
                source="simulated", hardware=f"policy plans on {p.routing_text()}")

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
# Mean rank skewness per EP size (top rows) and per domain, policies sorted from the most balanced:

# %%
ex.text.ranked(table, ["sweep", "ep", "workload"], "skewness", ascending=True).round(3)

# %%
run.finish()
print("figures:", [f["name"] for f in run.figures])
