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
# The headline ratios rest on the set-up card (`relibra setup show token-budget-tp1`, data/setups/token-budget-tp1.toml):
# every input has a value and a source, and the assumed ones a range. This notebook moves **one
# input at a time** over its range (assumed inputs) or its alternatives (measured and published
# ones: other link measurements, other batch layouts), the others at the card's values, and records
# three ratios of simulated tokens per second:
#
# * ReLibra / Megatron (the paper's "up to 1.6x");
# * ReLibra / EPLB+ (EPLB given this step's exact loads; the paper's "up to 1.2x");
# * ReLibra / balanced-compute (the real routing and its all-to-all, every GPU at the mean expert
#   compute: the best any placement could reach).
#
# Knobs and where they act (`relibra.studies.sensitivity.KNOBS`):
#
# | knob | card entry | what moves |
# |---|---|---|
# | batch layout | batch.layout | how sequences reach (micro-batch, rank) slots: token-budget packing (slime, verl) or one sequence per slot |
# | tokens per micro-batch | batch.tokens_per_gpu_per_microbatch | the token budget (4k-32k covers budget / TP of the recipes) |
# | data-parallel size | batch.data_parallel_size | sequences per rank per step |
# | samples per prompt | batch.responses_per_prompt | 8 (slime) or 16 (verl) responses per prompt |
# | sequence length | lengths.* | every generated sequence's length, scaled |
# | topic concentration | (routing calibration) | how peaked one sequence's topic mixture is |
# | spare slots | training.spare_slots_per_gpu | ReLibra's replica slots per GPU |
# | optimizer sharding | training.distributed_optimizer | what a migrated expert carries |
# | NVLink rate, RDMA rate | cluster.* | H800's re-counted rates to the datasheet's |
# | GEMM rate, half-saturation | compute.* | the expert GEMM's speed and its fixed cost per copy |
# | attention efficiency | compute.attention_efficiency | the dense window the transfers hide behind |
# | collective latency | compute.collective_latency_s | the fixed cost of every exchange and replica transfer |
# | cluster preset | - | the card's cluster against `h800`, `paper-datasheet`, `h100` |
#
# Every number is **simulated** (`relibra.sim`) on synthetic RL traces; the profile sets the scale
# and, in `tiny`, a small knob set.

# %% tags=["parameters"]
profile = "laptop"  # tiny | laptop (default) | paper | gpu (see relibra.experiments.PROFILES)
model = None        # one model preset (default: the profile's)
workload = None     # math | science | instruct | code | mixed
ep = None           # expert-parallel size of the default set-up
setup = "token-budget-tp1"     # set-up card of the default: token-budget-tp1 | paper-stated | one-sequence | a .toml path (relibra setup list)
steps = None        # training steps per trace (the first only gives history)
knobs = None        # comma-separated subset, e.g. "batch layout,NVLink rate" (default: the profile's; all in laptop)
seed = 0            # same seed, same numbers
out_dir = None      # default: results/interactive/10_sensitivity

# %%
from relibra import experiments as ex, plots
from relibra.studies.sensitivity import knob_values

run = ex.start("10_sensitivity", globals())  # unknown or out-of-range parameters fail here
p, sizes = run.params, run.sizes
print(run.scale_note())
print("model:", ex.text.model_differences([p.model]))

# %%
result = run.compute()
frame, tornado = result.sensitivity, result.tornado
print("each knob's values, from the set-up card's ranges:", knob_values(setup=p.setup))

# %% [markdown]
# ## The tornado
#
# Per ratio, one bar per knob from the lowest to the highest ratio over the knob's values, as the %
# change from the default set-up (black line); every panel has the same scale, so equal lengths are
# equal relative changes. Each bar's end names the knob value that gives it. The widest bars, on top,
# are the choices the headline depends on most.

# %%
subtitle = p.subtitle(sizes)
fig = plots.tornado_plot(tornado, subtitle)
run.save_figure(fig, "tornado", "Simulated ReLibra/Megatron, ReLibra/EPLB+ and ReLibra/balanced-compute with one "
                f"knob at a time moved around the default set-up, sorted by swing - {subtitle}")

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
