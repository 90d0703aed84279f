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
# # 00 - Expert parallelism and load imbalance, from scratch
#
# A Mixture-of-Experts (MoE) layer holds many *experts* (small feed-forward networks) and a *router*
# that sends every token to its top-k experts. With **expert parallelism (EP)** the experts are spread
# over GPUs: each GPU is *home* to a few of them. A layer then runs in phases: **dispatch** (an
# all-to-all sends every token to the GPUs that hold its experts), **expert compute**, and **combine**
# (a second all-to-all brings the results back). Every GPU waits for the slowest one, so the layer runs
# at the pace of the GPU with the **most tokens**. *Rank skewness* = max tokens per GPU / mean tokens
# per GPU says how much slower than a perfectly balanced layer that is.
#
# This notebook builds that up on one toy layer (16 experts, top-2) spread over `ep` GPUs in 2 nodes,
# one micro-batch at a time: routing, static placement and per-GPU load (section 1); a balancing plan,
# drawn (section 2); what the simulator charges for each phase (section 3); every combination of the
# two levers (section 4); and sliders to play with (section 5). Every number comes from
# `relibra.experiments`, every figure from `relibra.plots`, the times from the kit's cost model.
#
# The parameters below are all this notebook reads; papermill (`-p name value`) may set any of them and
# nothing else.

# %% tags=["parameters"]
ep = 4                # GPUs of the EP group, as 2 nodes x ep/2 GPUs: 4, 8 or 16
placement = "search"  # static (Megatron) | search (ReLibra's annealing) | lpt (greedy placement)
spare_slots = 2       # replica slots per GPU, 0-4 (0 means no replication)
skew = 1.2            # Zipf exponent of expert popularity, 0-3 (0 means uniform)
shift = 0.5           # share of the popularity ranking reshuffled between micro-batches, 0-1
tokens_per_gpu = 4096 # tokens each GPU routes per micro-batch (each picks 2 experts)
micro_batches = 4     # micro-batches in the toy step
micro_batch = 0       # which micro-batch sections 1-3 show
seed = 0              # same seed, same numbers
out_dir = None        # default: results/00_tutorial
interactive = True    # show the sliders of section 5 when a live front end is attached

# %%
from relibra import experiments as ex, plots
from relibra.experiments import narrative as nr

run = ex.start("00_tutorial", globals())  # unknown or out-of-range parameters fail here, before any work
cfg = run.config
print(cfg.scale_note())
print("results go to", cfg.out_dir)

# %% [markdown]
# ## 1. Routing, static placement, per-GPU load
#
# `tutorial_trace` draws the routing: in each micro-batch every GPU routes `tokens_per_gpu` tokens, and
# each token picks 2 of the 16 experts. Expert popularity follows a Zipf law with exponent `skew`;
# between micro-batches a share `shift` of the popularity ranking is reshuffled, as happens in RL when
# each micro-batch holds different prompts and responses. The table counts token-expert pairs per
# expert; `home_gpu` is the GPU that holds the expert under the chosen placement (static: experts
# 0-3 on GPU 0, 4-7 on GPU 1, ... at EP 4).

# %%
result = run.compute()
case = result.case
case["expert_tokens"].pivot(index="micro_batch", columns="expert", values="tokens")

# %% [markdown]
# Summing each GPU's home experts gives its load. Blue: tokens of experts it is home to; orange: tokens it
# takes for another GPU's expert as a replica (none with `spare_slots = 0`). The dashed line is the
# balanced mean; the outlined bar is the GPU everyone waits for. Right: the simulated expert-compute time
# per GPU.

# %%
fig = plots.tutorial_figure(case, cfg.extra["micro_batch"])
run.save_figure(fig, "per_gpu_load", "Tokens and simulated expert-compute time per GPU for the chosen placement "
                "and replicas", source="simulated", hardware=case["hardware"])
nr.show(nr.tutorial_load_story(case, cfg.extra["micro_batch"]))

# %% [markdown]
# **What to notice.** The busiest GPU is the one whose home experts happen to be popular in this
# micro-batch; the skewness in the left title is exactly how much longer it computes than the mean.
#
# **Try this.** Set `skew = 0` (uniform routing): the bars even out. Set `shift = 0` and compare
# micro-batches 0 and 3: the hot experts stay put, so a placement chosen once would fit every
# micro-batch.

# %% [markdown]
# ## 2. A StepPlan, drawn
#
# A balancing policy answers two questions for the step, and the kit records its answer as a `StepPlan`:
# **where is every expert's home** (one placement per step; changing it migrates weights), and, per
# micro-batch, **which spare slots hold a copy of which expert and how many of its tokens go there**.
# Left: the expert-home map, one box per GPU, home experts in blue (shade and number: tokens computed
# there) and spare slots in orange when they hold a copy. Right: the same plan as a flow, every expert's
# tokens (left column) split between its home GPU (blue bands) and its copies (orange bands).

# %%
fig = plots.plan_figure(case, cfg.extra["micro_batch"])
run.save_figure(fig, "step_plan", "The StepPlan of one micro-batch: expert-home map with replica slots, and the "
                "token split from experts to GPUs", source="simulated", hardware=case["hardware"])
nr.show(nr.tutorial_plan_story(case, cfg.extra["micro_batch"]))

# %% [markdown]
# **What to notice.** Copies live only in the home's node (ReLibra keeps replica traffic on NVLink), and a
# copy takes just enough tokens to bring the GPUs of that node level, not half of them.
#
# **Try this.** Set `placement = "search"` and `spare_slots = 2`: the homes change (the map's blue
# squares move) so that the nodes are balanced, and the copies even out the GPUs inside each node.

# %% [markdown]
# ## 3. What the simulator charges, phase by phase
#
# The cost model (`relibra.costs`) prices the plan: attention, the two all-to-alls and the slowest GPU's
# expert GEMMs, forward and backward, plus replica weight pushes and gradient pulls where they are not
# hidden behind attention.

# %%
fig = plots.phase_figure(case, cfg.extra["micro_batch"])
run.save_figure(fig, "phases", "Simulated time per phase of the toy layer for one micro-batch, forward and "
                "backward", source="simulated", hardware=case["hardware"])
nr.show(nr.tutorial_phase_story(case, cfg.extra["micro_batch"]))

# %% [markdown]
# **What to notice.** Balancing only shortens the expert-compute phase; how much that is worth depends
# on its share of the layer.
#
# **Try this.** Raise `tokens_per_gpu` to 16384: expert compute grows with tokens faster than the
# fixed costs, so balance matters more.

# %% [markdown]
# ## 4. All combinations
#
# The same trace under every placement and 0, 1 or 2 spare slots per GPU. Reordering alone balances
# the *whole step* but cannot follow each micro-batch; replication follows each micro-batch but only
# inside a node; together they approach the balanced ideal. Each bar is labelled with the most slots any
# GPU actually filled.

# %%
grid = result.placement_replica_grid
fig = plots.tutorial_grid_figure(grid)
run.save_figure(fig, "placement_replica_grid", "Rank skewness and slowest-GPU expert time for every placement "
                "and number of spare slots", source="simulated", hardware=grid["hardware"].iloc[0])
nr.show(nr.tutorial_grid_story(grid))

# %% [markdown]
# **What to notice.** More spare slots help only while the planner has a use for them: when the bars for
# two slot counts match, the label shows the planner filled no more slots.
#
# **Try this.** Set `ep = 8` (4 GPUs per node): a node now has more GPUs to share a hot expert with, and
# the second slot starts to matter.

# %% [markdown]
# ## 5. Try it (interactive)
#
# In JupyterLab this shows controls for EP, spare slots and skew (and placement, shift, micro-batch);
# moving one recomputes the plan and redraws the load bars and the plan. Headless (papermill sets
# `interactive = False`, or no front end) it shows nothing.

# %%
plots.tutorial_interactive(ex.tutorial_case, choices={"ep": ex.TUTORIAL_EP_SIZES, "placement": ex.TUTORIAL_PLACEMENTS,
                           "spare_slots": ex.TUTORIAL_MAX_SPARE_SLOTS}, enabled=interactive, **ex.tutorial_args(cfg))

# %% [markdown]
# **What to notice.** With `skew` near 0 no policy has anything to fix; the gap between placements opens
# as `skew` grows.
#
# **Try this.** Find the smallest `spare_slots` at which `search` reaches skewness 1.1 for `skew = 2`.

# %%
run.finish()
print("figures:", [f["name"] for f in run.figures])
