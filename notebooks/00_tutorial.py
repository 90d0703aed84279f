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
# replicas remove, when routing replay tells the planner each micro-batch's exact loads?**
#
# A Mixture-of-Experts (MoE) layer holds many *experts* (small feed-forward networks) and a *router*
# that sends every token to its top-k experts. With **expert parallelism (EP)** the experts are spread
# over GPUs: each GPU is *home* to a few of them. A layer then runs in phases: **dispatch** (an
# all-to-all sends every token to the GPUs that hold its experts), **expert compute**, and **combine**
# (a second all-to-all brings the results back). Every GPU waits for the slowest one, so the layer runs
# at the pace of the GPU with the **most tokens**. *Rank skewness* = max tokens per GPU / mean tokens
# per GPU says how much slower than a perfectly balanced layer that is.
#
# A training **step** processes its batch in several **micro-batches**, one after another; each
# micro-batch routes its own tokens. Two levers balance the GPUs:
#
# - the **placement**: which GPU is home to which expert, chosen once per step. *static* is Megatron's
#   layout (experts 0-3 on GPU 0, 4-7 on GPU 1, ...); *search* is ReLibra's, a *simulated annealing*
#   search (try swapping two experts' homes, keep the swap if it balances better, sometimes keep a worse
#   one early on to escape a dead end); *lpt* is the greedy "longest processing time first" rule (take
#   experts hottest first, put each on the GPU with the fewest tokens so far);
# - **replicas**: each GPU has a few *spare slots*; a slot can hold a copy of another GPU's expert for
#   one micro-batch, and take part of that expert's tokens.
#
# The toy routing's expert popularity follows a **Zipf law**: the expert ranked r-th most popular gets a
# share proportional to 1 / r^skew (skew 0: all equal; the larger, the more a few experts dominate).
# The *shift* is how much of that ranking changes from one micro-batch to the next.
#
# One toy layer (16 experts, top-2) over `ep` GPUs in 2 nodes answers it below: first in one figure,
# then step by step (routing and per-GPU load, a balancing plan drawn, what the simulator charges per
# phase), then why the plan can use exact loads at all (routing replay), why its two levers work at two
# timescales, and the sliders. Every number comes from `relibra.experiments`, every figure from
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
out_dir = None        # default: results/interactive/00_tutorial (never the reproduction's results/00_tutorial)
interactive = True    # show the sliders of section 6 when a live front end is attached

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
#
# The planner fills the slots by **water-filling**: inside each node it repeatedly moves tokens of the
# busiest GPU's hottest expert onto a copy on the node's least-loaded GPU, until the node's GPUs are level
# with their mean (like water poured into connected vessels); it stops early when no move is worth a copy.

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
# Change a parameter in the parameters cell at the top (or pass it with `-p`) and rerun. Each suggestion says which way
# the result moves; `tests/test_lessons.py` makes exactly that change and checks the direction.

# %%
ex.show(run.try_this())

# %% [markdown]
# ## 1. Routing, static placement, per-GPU load
#
# `tutorial_trace` draws the routing: in each micro-batch every GPU routes `tokens_per_gpu` tokens, and
# each token picks 2 of the 16 experts. Expert popularity follows the Zipf law with exponent `skew`;
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
# ## 4. Routing replay: why the planner may use each micro-batch's exact loads
#
# Everything above planned from the loads of the very micro-batches it balances. In ordinary training
# nobody knows them in advance: a balancer such as EPLB plans from **history**, the loads of earlier
# steps. RL post-training is different: the rollout has already run every sequence through the model,
# and **routing replay** (the paper's R3) records which experts each token chose and makes the training
# pass route the same way. So before a step starts, the planner can know every micro-batch's exact loads.
#
# The figure plans step 1 of a two-step toy trace twice with the chosen policy: from step 0's loads
# (history: its homes and copies are kept, each copy taking the same share of its expert's tokens), and
# from step 1's replayed loads. The micro-batch shift grows along the x axis.

# %%
fig = plots.replay_figure(result.replay, run.scale_note())
run.save_figure(fig, "routing_replay", "Slowest-GPU expert time and rank skewness of a plan made from the previous "
                f"step's loads and of one made from the replayed exact loads, against the micro-batch shift "
                f"({run.scale_note()})", source="simulated", hardware=case["hardware"])
ex.show(nb.replay_story(nb.summarize(result)))

# %% [markdown]
# ## 5. Two timescales: reorder across nodes once per step, replicate inside a node per micro-batch
#
# ReLibra's two levers move different amounts of data over different links. Inside a node GPUs talk over
# **NVLink**; between nodes over **RDMA** network cards, several times slower. A replica must receive its
# expert's weights before its micro-batch (and send the gradient back after), so copies are cheap only
# inside a node: ReLibra makes them per micro-batch, there. Moving an expert's *home* to another node is
# worth it only once per step, because that one migration then serves all the step's micro-batches and
# layers. The numbers, from the link rates the cost model uses:

# %%
ex.show(nb.timescale_story(nb.summarize(result)))

# %% [markdown]
# ## 6. Try it: the sliders
#
# In JupyterLab the cell below shows controls for EP, spare slots and skew (and placement, shift,
# micro-batch); moving one recomputes the plan and redraws the load bars and the plan. Run headless
# with `interactive = False` (`relibra reproduce` sets it; papermill keeps the default unless you pass
# `-p interactive False`) it shows nothing, so the figure after it draws what the skew slider shows:
# static placement without replicas and the chosen plan, at every skew from 0 to 3.

# %%
plots.tutorial_interactive(tutorial.tutorial_case, choices={"ep": tutorial.TUTORIAL_EP_SIZES, "placement":
                           tutorial.TUTORIAL_PLACEMENTS, "spare_slots": tutorial.TUTORIAL_MAX_SPARE_SLOTS},
                           enabled=interactive, **p.case_args())

# %%
fig = plots.skew_sweep_figure(result.skew_sweep, run.scale_note())
run.save_figure(fig, "skew_sweep", "Rank skewness and slowest-GPU expert time against the skew slider, static "
                f"placement vs the chosen plan ({run.scale_note()})", source="simulated", hardware=case["hardware"])
ex.show(nb.skew_story(nb.summarize(result)))

# %% [markdown]
# ## Summary
#
# - A layer runs at the pace of its busiest GPU; rank skewness says how far from balanced that is, and
#   hot experts under a static placement make it large.
# - Two levers fix it: the placement (homes, once per step, across nodes) and replicas (copies in spare
#   slots, per micro-batch, inside a node), each at the timescale its link allows (section 5).
# - Both need to know where the tokens go. History guesses, and the guess is wrong as soon as the hot
#   experts move between micro-batches; routing replay gives the exact loads of every micro-batch of an
#   RL step before it runs, which is what makes per-micro-batch balancing possible (section 4).
#
# Next: notebook `01_routing_dynamics` measures how much real-looking RL routing shifts between
# micro-batches and steps, the quantity that decides how much replay gains over history.

# %%
run.finish()
print("figures:", [f["name"] for f in run.figures])
