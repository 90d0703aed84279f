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
# **The question: what is expert-parallel load imbalance, and how much of it do a better placement and
# replicas remove?**
#
# A Mixture-of-Experts (MoE) layer holds many *experts* (small feed-forward networks) and a *router*
# that sends every token to its top-k experts. With **expert parallelism (EP)** the experts are spread
# over GPUs: each GPU is *home* to a few of them. A layer then runs in phases: **dispatch** (an
# all-to-all sends every token to the GPUs that hold its experts), **expert compute**, and **combine**
# (a second all-to-all brings the results back). Every GPU waits for the slowest one, so the layer runs
# at the pace of the GPU with the **most tokens**. *Rank skewness* = max tokens per GPU / mean tokens
# per GPU says how much slower than a perfectly balanced layer that is.
#
# One toy layer (16 experts, top-2) over `ep` GPUs in 2 nodes answers it below: first in one figure,
# then step by step (routing and per-GPU load, a balancing plan drawn, what the simulator charges per
# phase, and the skew slider). Every number comes from `relibra.experiments`, every figure from
# `relibra.plots`, the times from the kit's cost model; papermill (`-p name value`) may set any of the
# parameters below and nothing else.

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
interactive = True    # show the sliders of section 4 when a live front end is attached

# %%
from relibra import experiments as ex, plots
from relibra.experiments import tutorial

run = ex.start("00_tutorial", globals())  # unknown or out-of-range parameters fail here, before any work
p, nb = run.params, run.notebook
print(run.scale_note())
result = run.compute()
case = result.case

# %% [markdown]
# ## The answer in one figure
#
# The same routing under every placement (static: Megatron's contiguous homes; search: ReLibra's
# annealing; lpt: greedy) and 0, 1 or 2 spare replica slots per GPU. Left: rank skewness; right: the
# slowest GPU's expert time, which the whole layer waits for. Dashed: perfectly balanced. Each bar is
# labelled with the most slots any GPU actually filled.

# %%
grid = result.placement_replica_grid
fig = plots.tutorial_grid_figure(grid, run.scale_note())
run.save_figure(fig, "placement_replica_grid", "Rank skewness and slowest-GPU expert time for every placement "
                f"and number of spare slots ({run.scale_note()})", source="simulated",
                hardware=grid["hardware"].iloc[0])

# %% [markdown]
# ### What to notice

# %%
ex.show(run.story(result))

# %% [markdown]
# ### Try this
#
# Change a parameter in the cell above (or pass it with `-p`) and rerun. Each suggestion says which way
# the result moves; `tests/test_lessons.py` makes exactly that change and checks the direction.

# %%
ex.show(run.try_this())

# %% [markdown]
# ## 1. Routing, static placement, per-GPU load
#
# `tutorial_trace` draws the routing: in each micro-batch every GPU routes `tokens_per_gpu` tokens, and
# each token picks 2 of the 16 experts. Expert popularity follows a Zipf law with exponent `skew`;
# between micro-batches a share `shift` of the popularity ranking is reshuffled, as happens in RL when
# each micro-batch holds different prompts and responses. The table counts token-expert pairs per
# micro-batch and expert, hottest experts (over the step) first.

# %%
et = case["expert_tokens"].pivot(index="micro_batch", columns="expert", values="tokens")
et[et.sum().sort_values(ascending=False).index]

# %% [markdown]
# Summing each GPU's experts gives its load under the chosen plan. Blue: tokens of experts it is home
# to; orange: tokens it takes for another GPU's expert as a replica. The dashed line is the balanced
# mean; the outlined bar is the GPU everyone waits for. Right: the simulated expert-compute time per GPU.

# %%
fig = plots.tutorial_figure(case, p.micro_batch)
run.save_figure(fig, "per_gpu_load", "Tokens and simulated expert-compute time per GPU for the chosen placement "
                f"and replicas ({run.scale_note()})", source="simulated", hardware=case["hardware"])
ex.show(nb.load_story(case, p.micro_batch))

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
fig = plots.plan_figure(case, p.micro_batch)
run.save_figure(fig, "step_plan", "The StepPlan of one micro-batch: expert-home map with replica slots, and the "
                f"token split from experts to GPUs ({run.scale_note()})", source="simulated",
                hardware=case["hardware"])
ex.show(nb.plan_story(case, p.micro_batch))

# %% [markdown]
# ## 3. What the simulator charges, phase by phase
#
# The cost model (`relibra.costs`) prices the plan: attention, the two all-to-alls and the slowest GPU's
# expert GEMMs, forward and backward, plus replica weight pushes and gradient pulls where they are not
# hidden behind attention. Balancing shortens only the expert-compute phase (and the all-to-all's wait
# on the busiest receiver), so its share of the layer bounds what balancing can gain.

# %%
fig = plots.phase_figure(case, p.micro_batch)
run.save_figure(fig, "phases", "Simulated time per phase of the toy layer for one micro-batch, forward and "
                f"backward ({run.scale_note()})", source="simulated", hardware=case["hardware"])
ex.show(nb.phase_story(case, p.micro_batch))

# %% [markdown]
# ## 4. Try it: the sliders
#
# In JupyterLab the cell below shows controls for EP, spare slots and skew (and placement, shift,
# micro-batch); moving one recomputes the plan and redraws the load bars and the plan. Run headless
# (papermill sets `interactive = False`) it shows nothing, so the figure after it draws what the skew
# slider shows: static placement without replicas and the chosen plan, at every skew from 0 to 3.

# %%
plots.tutorial_interactive(tutorial.tutorial_case, choices={"ep": tutorial.TUTORIAL_EP_SIZES, "placement":
                           tutorial.TUTORIAL_PLACEMENTS, "spare_slots": tutorial.TUTORIAL_MAX_SPARE_SLOTS},
                           enabled=interactive, **p.case_args())

# %%
fig = plots.skew_sweep_figure(result.skew_sweep, run.scale_note())
run.save_figure(fig, "skew_sweep", "Rank skewness and slowest-GPU expert time against the skew slider, static "
                f"placement vs the chosen plan ({run.scale_note()})", source="simulated", hardware=case["hardware"])
ex.show(nb.skew_story(nb.summarize(result)))

# %%
run.finish()
print("figures:", [f["name"] for f in run.figures])
