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
# # 10 - Sensitivity: how far does each headline ratio move with the set-up?
#
# **The question: which set-up choices does the headline depend on, and how far does each move it?**
#
# The headline ratios rest on choices nobody measured on the paper's cluster: how an RL framework
# lays sequences into (micro-batch, rank) slots, how many tokens each slot holds, how peaked a
# sequence's topics are, how many spare replica slots ReLibra gets, the link rates and the GEMM
# efficiency curve, sequence lengths and the cluster itself. This notebook moves **one knob at a
# time** around the default set-up and records three ratios of simulated tokens per second:
#
# * ReLibra / Megatron (the paper's "up to 1.6x");
# * ReLibra / EPLB+ (EPLB given this step's exact loads; the paper's "up to 1.2x");
# * ReLibra / balanced-compute (the real routing and its all-to-all, every GPU at the mean expert
#   compute: the best any placement could reach).
#
# Knobs and where they act (`relibra.experiments.sensitivity`):
#
# | knob | what moves |
# |---|---|
# | batch layout | how sequences reach slots (`relibra.workloads.BATCH_LAYOUTS`: verl, slime, Megatron-LM) |
# | tokens per slot | tokens per (micro-batch, rank); `derived` = from the paper's batch of 1024 sequences |
# | topic concentration | how peaked one sequence's topic mixture is (small: one or two topics) |
# | spare slots | ReLibra's replica slots per GPU |
# | NVLink rate, RDMA rate | the cluster's link rates, moved by the factors printed below (NVLink up to the datasheet's rate) |
# | GEMM half-saturation | tokens at which an expert GEMM reaches half its peak rate (same kind of factors) |
# | sequence length | every generated sequence's length, scaled |
# | cluster preset | `paper` (DeepEP-measured links), `paper-datasheet`, `h100` |
#
# Every number is **simulated** (`relibra.sim`) on synthetic RL traces; the profile sets the scale
# and, in `tiny`, a small knob set.

# %% tags=["parameters"]
profile = "laptop"  # tiny | laptop (default) | paper | gpu (see relibra.experiments.PROFILES)
model = None        # one model preset (default: the profile's)
workload = None     # math | science | instruct | code | mixed
ep = None           # expert-parallel size of the default set-up
cluster = None      # cluster preset of the default set-up: paper | h800 | nvl72 | cpu-gloo (see relibra.cluster)
steps = None        # training steps per trace (the first only gives history)
knobs = None        # comma-separated subset, e.g. "batch layout,NVLink rate" (default: the profile's; all in laptop)
seed = 0            # same seed, same numbers
out_dir = None      # default: results/10_sensitivity

# %%
from relibra import experiments as ex, plots
from relibra.experiments import narrative as nr

run = ex.start("10_sensitivity", globals())  # unknown or out-of-range parameters fail here
cfg = run.config
print(cfg.scale_note())
print("model:", nr.model_differences([cfg.model]))

# %%
result = run.compute()
frame, tornado = result.sensitivity, result.tornado
print("cost knobs move by these factors of the cluster preset's value:",
      {k: " / ".join(f"{f:.3g}x" for f in v) for k, v in ex.sensitivity_cost_factors().items()})

# %% [markdown]
# ## The tornado
#
# Per ratio, one bar per knob from the lowest to the highest ratio over the knob's values, as the %
# change from the default set-up (black line); every panel has the same scale, so equal lengths are
# equal relative changes. Each bar's end names the knob value that gives it. The widest bars, on top,
# are the choices the headline depends on most.

# %%
subtitle = f"{cfg.simulated_label()}, EP {cfg.ep}, model {cfg.model}; workload {cfg.workload} | {cfg.scale_note()}"
fig = plots.tornado_plot(tornado, subtitle)
run.save_figure(fig, "tornado", "Simulated ReLibra/Megatron, ReLibra/EPLB+ and ReLibra/balanced-compute with one "
                f"knob at a time moved around the default set-up, sorted by swing - {subtitle}")

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
# ## The numbers
#
# Per ratio and knob, sorted by swing (the tornado's bars):

# %%
tornado.round(4)

# %% [markdown]
# One row per (knob, value); `is_default` marks the default set-up, which is simulated once and
# shared by every knob's default row. Rows sorted by ReLibra / Megatron, highest first.

# %%
frame.drop(columns=["policy", "model", "ep"]).sort_values("relibra_over_megatron", ascending=False).round(4)

# %%
run.finish()
print("figures:", [f["name"] for f in run.figures])
