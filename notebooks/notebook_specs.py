"""Narrative and calls of every notebook; notebooks/build_notebooks.py turns them into .ipynb files.

Each spec: title, intro (markdown), body (cells made with md() and code()), optional extra_params
(lines appended to the parameters cell) and extra_args (those names passed on to ex.start).
"""

from __future__ import annotations

from nbformat.v4 import new_code_cell, new_markdown_cell


def md(text: str):
    return new_markdown_cell(text.strip("\n"))


def code(text: str):
    return new_code_cell(text.strip("\n"))


SPECS: dict[str, dict] = {}

# ---- 00 tutorial ---------------------------------------------------------------------------------
SPECS["00_tutorial"] = dict(
    title="00 - Expert parallelism and load imbalance, from scratch",
    intro="""
A Mixture-of-Experts (MoE) layer holds many *experts* (small feed-forward networks) and a *router*
that sends every token to its top-k experts. With **expert parallelism (EP)** the experts are spread
over GPUs: each GPU is *home* to a few of them. A layer then runs in three phases:

1. **dispatch**: an all-to-all sends every token to the GPUs that hold its experts;
2. **expert compute**: each GPU runs its experts on the tokens it received;
3. **combine**: a second all-to-all sends the results back.

Every GPU waits for the slowest one at each all-to-all, so the step runs at the pace of the GPU
with the **most tokens**. The *rank skewness*, max tokens per GPU / mean tokens per GPU, says how
much slower than a perfectly balanced layer that is (2.0 = the busiest GPU does twice the average).

Two levers fix it, and this notebook lets you pull both on a toy layer of 16 experts over 4 GPUs
(2 nodes x 2 GPUs):

* **placement** - which GPU is home to which expert. `static` is Megatron's contiguous layout
  (experts 0-3 on GPU 0, ...); `search` is ReLibra's simulated-annealing reordering; `lpt` is the
  greedy longest-processing-time placement.
* **replicas** - spare slots where a GPU holds a *copy* of another GPU's hot expert for one
  micro-batch and takes part of its tokens (ReLibra keeps copies inside a node, where NVLink is fast).

Opened in JupyterLab, the cell marked *interactive* shows sliders; run headless (papermill) it uses
the parameters below. Everything here is computed by `relibra.experiments` and drawn by
`relibra.plots`; the times come from the kit's simulator.
""",
    extra_params='''\
placement = "static"  # static (Megatron) | search (ReLibra's annealing) | lpt (greedy placement)
spare_slots = 0       # replica slots per GPU (0 means no replication)
skew = 1.2            # how concentrated routing is: Zipf exponent of expert popularity (0 means uniform)
shift = 0.5           # how much hot experts move between micro-batches (0 never, 1 fully reshuffled)
micro_batch = 0       # which micro-batch the per-GPU bars show
interactive = True    # show ipywidgets sliders when a live front end is attached''',
    extra_args=("placement", "spare_slots", "skew", "shift", "micro_batch"),
    body=[
        md("""
## 1. A toy routing trace

`tutorial_trace` draws a routing trace: for each of 4 micro-batches, every GPU holds 512 tokens and
each token picks its top-2 of 16 experts. Expert popularity follows a Zipf law with exponent `skew`;
between micro-batches a share `shift` of the popularity ranking is reshuffled, as happens in RL when
each micro-batch holds different prompts and responses.
"""),
        code("""
case = ex.tutorial_case(**run.config.extra, seed=cfg.seed)
run.save_csv(case["expert_tokens"], "expert_tokens", "tokens per expert and micro-batch")
case["expert_tokens"].pivot(index="micro_batch", columns="expert", values="tokens")
"""),
        md("""
## 2. Tokens and time per GPU

With the chosen placement and spare slots, the kit's policy builds a plan (homes, replicas, token
split) and the simulator prices each GPU's expert compute. Bars: tokens each GPU computes, split into
tokens of experts it is home to and tokens it takes as a replica. The dashed line is the balanced
mean. The right panel shows the simulated time of the layer's expert compute per GPU: the slowest
GPU sets the pace.
"""),
        code("""
run.save_csv(case["gpu_table"], "gpu_load", "tokens and simulated expert seconds per GPU")
fig = plots.tutorial_figure(case, cfg.extra["micro_batch"])
run.save_figure(fig, "per_gpu_load", "Tokens and simulated expert-compute time per GPU for the chosen placement "
                "and replicas", source="simulated", hardware=case["hardware"])
case["summary"]
"""),
        md("""
## 3. All combinations

The same toy trace under every combination of placement and spare slots. Reordering alone balances
the *whole step* but cannot follow each micro-batch; replication follows each micro-batch but only
inside a node; together they approach the balanced ideal.
"""),
        code("""
grid = ex.tutorial_grid(skew=cfg.extra["skew"], shift=cfg.extra["shift"], seed=cfg.seed)
run.save_csv(grid, "placement_replica_grid", "rank skewness and slowest-GPU time for every placement x spare slots")
fig = plots.tutorial_grid_figure(grid)
run.save_figure(fig, "placement_replica_grid", "Rank skewness and slowest-GPU expert time for every placement "
                "and number of spare slots", source="simulated", hardware=grid["hardware"].iloc[0])
"""),
        md("""
## 4. Try it (interactive)

In JupyterLab this shows sliders for the same parameters; moving one recomputes the plan and redraws
the bars. Under papermill (`interactive=False`, or no front end) it does nothing.
"""),
        code("""
plots.tutorial_interactive(ex.tutorial_case, enabled=interactive, **cfg.extra)
"""),
    ],
)

# ---- 01 routing dynamics -----------------------------------------------------------------------
SPECS["01_routing_dynamics"] = dict(
    title="01 - Routing dynamics: why history-based balancing misses in RL",
    intro="""
Load balancers such as EPLB place experts (and replicas) from a **prediction** of expert load, usually
a moving average of past steps. That works when load is steady. In RL post-training, each
micro-batch holds different prompts and responses, so **hot experts shift from one micro-batch to the
next**, while the whole-step total, summed over hundreds of sequences, moves slowly.

ReLibra builds on a fact of RL: *routing replay* records, during rollout, which experts every token
chose, and replays them in training. So the exact load of every micro-batch is known **before** the
training step. This notebook measures what that knowledge is worth on the kit's synthetic RL traces:

1. per-micro-batch expert-load heatmaps against whole-step ones;
2. how much of the hottest 10% of experts stays hot between micro-batches, steps and a history prediction;
3. how wrong predictions are: history (EPLB) and even the exact whole-step total (EPLB+) against each micro-batch;
4. what static placement does with that load: rank skewness per micro-batch and per step.
""",
    body=[
        code("""
traces = ex.workload_traces(cfg)
trace = traces[cfg.workload]
trace.stats()
"""),
        md("""
## 1. Expert load, micro-batch by micro-batch

Left: the share of token-slots each expert of one MoE layer receives in every micro-batch of step 0.
Right: the same layer summed over each whole step. Vertical stripes on the right (steady hot experts)
break into a moving pattern on the left.
"""),
        code("""
loads = ex.expert_load_table(trace, step=0, layer=0)
run.save_csv(loads, "expert_load", "tokens per expert: micro-batches of step 0 and whole steps, layer 0")
fig = plots.expert_load_heatmaps(loads, cfg.trace_label())
run.save_figure(fig, "expert_load_heatmaps", "Share of token-slots per expert, per micro-batch (left) and per "
                "whole step (right), MoE layer 0", source="simulated", hardware="synthetic trace generator")
"""),
        md("""
## 2. How far hot experts shift

*Hot-expert overlap*: the share of one load vector's hottest 10% of experts that are also among the
other's hottest 10% (1 = the same hot set). *Load correlation*: Pearson correlation of the two load
vectors. The history prediction is the moving average of up to 4 previous whole steps.
"""),
        code("""
shift = ex.shift_table(traces)
run.save_csv(shift, "shift_stats", "hot-expert overlap and load correlation per comparison and workload")
fig = plots.shift_bars(shift, cfg.trace_label())
run.save_figure(fig, "shift", "Hot-expert overlap and load correlation between micro-batches, steps and a "
                "history prediction, per workload", source="simulated", hardware="synthetic trace generator")
shift.pivot_table(index="comparison", columns=["metric", "trace"], values="value").round(3)
"""),
        md("""
## 3. How wrong a prediction is

The error is the share of token-slots a prediction puts on the wrong experts (total-variation
distance between load shares). EPLB sees the history; EPLB+ is given the exact whole-step load; only
replay knows each micro-batch.
"""),
        code("""
errors = ex.prediction_error_table(traces)
run.save_csv(errors, "prediction_error", "prediction error per predictor, target, step, micro-batch and layer")
fig = plots.prediction_error_plot(errors, cfg.trace_label())
run.save_figure(fig, "prediction_error", "Share of token-slots predicted on the wrong experts: history vs oracle "
                "step load, against whole steps and single micro-batches", source="simulated",
                hardware="synthetic trace generator")
errors.groupby(["predictor", "target"])["error"].describe().round(3)
"""),
        md("""
## 4. What static placement makes of it

Rank skewness under Megatron's static contiguous placement, for every micro-batch and layer, and for
the whole step. Every micro-batch waits for its busiest GPU, so the per-micro-batch figure is the one
that costs time.
"""),
        code("""
skew = ex.static_skewness_table(traces)
run.save_csv(skew, "static_skewness", "rank skewness under static placement per micro-batch / whole step")
fig = plots.static_skewness_plot(skew, cfg.trace_label())
run.save_figure(fig, "static_skewness", "Rank skewness (max / mean tokens per GPU) under static placement",
                source="simulated", hardware="synthetic trace generator")
run.note(static_skewness=skew[skew.scope == "micro-batch"].groupby("trace")["skewness"].mean().round(3).to_dict())
"""),
    ],
)

# ---- 02 throughput -----------------------------------------------------------------------------
SPECS["02_throughput"] = dict(
    title="02 - End-to-end training throughput: models x workloads x policies",
    intro="""
The paper's main result: training throughput (tokens per second) of three MoE models on five RL
workloads under every balancing policy, normalized to Megatron-LM's static placement.

Policies (see `relibra.policies`):
* `megatron` - static contiguous placement, no replicas;
* `eplb` - DeepSeek's EPLB fed with a moving average of past steps' loads (what it can know in practice);
* `eplb+` - EPLB given this step's exact loads (an oracle);
* `lplb+` - EPLB+'s replicas plus a linear program per micro-batch that moves tokens among them;
* `llep` - least-loaded expert parallelism: spills overloaded experts to any GPU, weights moved on the critical path;
* `relibra` - inter-batch reordering across nodes + intra-batch replication inside nodes, from replayed routing;
* `balanced` - routing forced uniform: the ideal, not a system.

Every policy is priced by the same cost model (`relibra.sim`) on the same trace; the numbers are
**simulated**, for the cluster preset named in each figure.
""",
    body=[
        code("""
table = ex.throughput_grid(cfg)
run.save_csv(table, "throughput", "simulated tokens/s and ratios per model, workload and policy")
table.pivot_table(index=["model", "workload"], columns="policy", values="speedup_vs_megatron").round(3)
"""),
        md("""
## Throughput normalized to Megatron

One panel per model; bars per workload and policy; 1.0 = Megatron. Balanced is the ceiling.
"""),
        code("""
fig = plots.throughput_bars(table, cfg.sim_subtitle())
run.save_figure(fig, "throughput_normalized", "Simulated training throughput normalized to Megatron, per model, "
                "workload and policy")
"""),
        md("""
## Fraction of the balanced ideal

How close each policy gets to the balanced bound (1.0), over all models and workloads.
"""),
        code("""
fig = plots.fraction_of_balanced(table, cfg.sim_subtitle())
run.save_figure(fig, "fraction_of_balanced", "Simulated throughput as a fraction of the balanced ideal, over "
                "models and workloads")
"""),
        md("""
## Headline ratios next to the paper's

The paper reports ReLibra up to 1.6x over Megatron-LM, up to 1.2x over EPLB+ and within 6-10% of
Balanced. The same ratios from this run:
"""),
        code("""
headline = ex.headline_ratios(table)
run.save_csv(headline, "headline_ratios", "ReLibra vs Megatron, vs EPLB+, and gap to Balanced, with the paper's claims")
run.note(headline=headline.to_dict(orient="records"))
headline
"""),
    ],
)

# ---- 03 ablation -------------------------------------------------------------------------------
SPECS["03_ablation"] = dict(
    title="03 - Ablation: what reordering and replication each contribute",
    intro="""
ReLibra has two mechanisms. Starting from Megatron's static placement:

* **+ reordering** (`relibra-reorder`): once per step, move expert homes across nodes so the step's
  load is balanced across nodes and GPUs. Cheap (once per step) but blind to each micro-batch.
* **+ replication** (`relibra-replicate`, on static homes): per micro-batch, copy hot experts into
  spare slots of other GPUs of the same node and split their tokens. Follows each micro-batch, but
  cannot move load between nodes.
* **both** (`relibra`): reordering balances the nodes, replication the GPUs inside them.

Balanced is the ideal. Numbers are **simulated** on the named cluster preset.
""",
    body=[
        code("""
table = ex.throughput_grid(cfg)
run.save_csv(table, "ablation", "simulated tokens/s and skewness per model, workload and ablation stage")
table.pivot_table(index="policy", columns="model", values="speedup_vs_megatron").round(3)
"""),
        code("""
fig = plots.ablation_plot(table, cfg.sim_subtitle())
run.save_figure(fig, "ablation", "Simulated throughput (normalized to Megatron) and rank skewness as the "
                "mechanisms are added; bars average over workloads, whiskers span them")
"""),
    ],
)

# ---- 04 reordering ------------------------------------------------------------------------------
SPECS["04_reordering"] = dict(
    title="04 - Inter-batch reordering: annealing search vs greedy LPT vs none",
    intro="""
Reordering decides, once per step, which GPU is home to each expert. Since replicas stay inside a
node, the placement must first balance the **nodes**; it should also keep tokens inside their node,
because cross-node (RDMA) bandwidth is ~9x lower than NVLink on the paper's cluster.

Compared here, all followed by the same intra-node replication:
* `relibra` - ReLibra's swap-based simulated annealing, scoring node and GPU balance with
  inter-node dispatch bytes;
* `relibra-lpt` - greedy longest-processing-time placement of each step's loads;
* `relibra-replicate` - no reordering (static homes).

Figures: simulated throughput, node-level skewness (max / mean tokens per node), the share of
dispatched tokens that cross nodes, and migration: bytes moved per step when homes change.
""",
    body=[
        code("""
table = ex.reorder_table(cfg)
run.save_csv(table, "reordering", "per workload, policy and step: throughput, node/GPU skewness, cross-node share, migration")
table.groupby("policy")[["speedup_vs_megatron", "node_skewness", "gpu_skewness", "cross_node_share",
                         "migration_gb"]].mean().round(3)
"""),
        code("""
fig = plots.reorder_plot(table, cfg.sim_subtitle())
run.save_figure(fig, "reordering", "Annealing search vs greedy LPT vs no reordering: simulated throughput, node "
                "skewness, cross-node token share and migration per step")
"""),
    ],
)

# ---- 05 replication -----------------------------------------------------------------------------
SPECS["05_replication"] = dict(
    title="05 - Intra-batch replication: joint replication vs placement-only vs splitting-only",
    intro="""
Inside a node, ReLibra decides per micro-batch and layer **which** hot experts get a copy in which
spare slot **and** how to split their tokens, jointly (an incremental greedy heuristic for the MILP).
Compared here, on the same reordered homes:

* `relibra` - joint replica placement and token split;
* `relibra-reorder` - placement only (reordering, no replicas);
* `relibra-split` - splitting only: a fixed set of replicas chosen once per step, tokens re-split per micro-batch.

Then the effect of the number of spare replica slots per GPU on ReLibra (the memory it costs is in
notebook 07). Numbers are **simulated**.
""",
    body=[
        code("""
table = ex.replication_table(cfg)
run.save_csv(table, "replication", "per workload and policy: throughput, GPU skewness, replicas used")
table.groupby("policy")[["speedup_vs_megatron", "gpu_skewness", "replicas_per_gpu"]].mean().round(3)
"""),
        code("""
fig = plots.replication_plot(table, cfg.sim_subtitle())
run.save_figure(fig, "replication", "Joint replication vs placement-only vs splitting-only: simulated throughput "
                "and per-micro-batch GPU skewness")
"""),
        md("""
## How many spare slots are worth it

ReLibra with 0 to 4 spare replica slots per GPU (the default in the kit's policy is marked).
"""),
        code("""
sweep = ex.spare_slot_sweep(cfg)
run.save_csv(sweep, "spare_slots", "ReLibra throughput and skewness vs spare replica slots per GPU")
fig = plots.spare_slot_plot(sweep, cfg.sim_subtitle())
run.save_figure(fig, "spare_slots", "Simulated ReLibra throughput and GPU skewness vs spare replica slots per GPU")
sweep
"""),
    ],
)

# ---- 06 skewness --------------------------------------------------------------------------------
SPECS["06_skewness"] = dict(
    title="06 - Rank skewness per policy, across EP sizes and task domains",
    intro="""
Rank skewness = max tokens per GPU / mean tokens per GPU, averaged over micro-batches and layers: how
far each micro-batch's busiest GPU is above the average. The paper reports Megatron above 2.0,
growing with EP. More GPUs per EP group means fewer experts per GPU, so one hot expert weighs more.

Left: EP 8 to 64 on one workload. Right: each task domain at the default EP. Computed from each
policy's plans (tokens per GPU), so no cost model is involved; the traces are synthetic.
""",
    body=[
        code("""
table = ex.skewness_sweep(cfg)
run.save_csv(table, "skewness", "mean and p95 rank skewness per policy, EP size and workload")
table.pivot_table(index=["sweep", "ep", "workload"], columns="policy", values="skewness").round(3)
"""),
        code("""
fig = plots.skewness_plot(table, cfg.plan_label(ep="8-64"))
run.save_figure(fig, "skewness", "Mean rank skewness per policy across EP sizes and task domains",
                source="simulated", hardware="policy plans on synthetic traces")
"""),
    ],
)

# ---- 07 overheads -------------------------------------------------------------------------------
SPECS["07_overheads"] = dict(
    title="07 - Overheads: planner time, migration, replica memory, transfer overlap",
    intro="""
Balancing is not free. This notebook measures what each policy costs:

* **planner time** per step, measured here on one CPU core, against the time it must hide behind.
  With routing replay the step's routing is known after rollout, and the planner runs while the RL
  pipeline computes log-probabilities of the rollout (a forward pass over the same batch). We take
  the simulated forward time of one training step as that window (the old-policy and reference
  log-prob passes are each at least one forward). Policies that plan per micro-batch at run time
  (LLEP) cannot hide it.
* **migration share**: reordering moves expert weights and optimizer state across nodes; its
  simulated time as a share of the step (paper: 1.4-2.1%).
* **replica memory**: the replica buffer as a share of one GPU's parameter memory, counted against
  the whole model (all its MoE layers) even when the profile simulates fewer (paper: 0.13-1.62%).
* **transfer overlap**: the share of replica weight pushes and gradient pulls hidden behind attention.

Planner times are **measured** (this machine, wall clock); the rest is **simulated**.
""",
    body=[
        code("""
table = ex.overhead_table(cfg)
run.save_csv(table, "overheads", "per policy: planner seconds per step (measured), simulated step/forward seconds, "
             "migration share, replica memory share, transfer overlap")
table.round(4)
"""),
        code("""
fig = plots.planner_time_plot(table, cfg.sim_subtitle())
run.save_figure(fig, "planner_time", "Planner wall time per step (measured on this CPU) next to the simulated "
                "forward-pass window it hides behind", source="measured", hardware=ex.this_machine())
"""),
        code("""
fig = plots.overhead_bars(table, cfg.sim_subtitle())
run.save_figure(fig, "overheads", "Simulated migration share of step time, replica memory share and transfer "
                "overlap per policy")
"""),
    ],
)

# ---- 08 runtime ---------------------------------------------------------------------------------
SPECS["08_runtime"] = dict(
    title="08 - The real runtime next to the simulator",
    intro="""
The simulator prices plans; the runtime (`relibra.runtime`) **executes** them: a small MoE
transformer built from megatron-core layers, trained with AdamW under torch.distributed, where the
same StepPlan decides expert homes, replica copies and token splits. On this CPU machine it runs
with the gloo backend, ranks grouped into simulated nodes; under the `gpu` profile the notebook reads
the metrics that the same entry point wrote on GPU nodes (NCCL) from `measured_dir`.

For `megatron` and `relibra` on a skewed trace we put the **measured** per-rank expert-compute time
and step time next to the simulator's prediction for the `cpu-gloo` preset (calibrated to this
machine). Measurements on 2 shared cores are noisy: the spread over repeats is shown.
""",
    extra_params='''\
nproc = None          # ranks of the gloo run (default: the profile's)
nodes = None          # simulated nodes the ranks are grouped into''',
    extra_args=("nproc", "nodes"),
    body=[
        code("""
result = ex.runtime_comparison(cfg)
run.save_csv(result["measured"], "measured", "measured per-rank metrics of the runtime (metrics schema)")
run.save_csv(result["comparison"], "runtime_vs_sim", "measured vs simulated seconds per policy and component")
result["comparison"]
"""),
        code("""
fig = plots.runtime_vs_sim_plot(result["comparison"], result["label"])
run.save_figure(fig, "runtime_vs_sim", "Measured runtime vs simulated prediction: expert compute and step time "
                "per policy", source="measured", hardware=result["hardware"])
"""),
        code("""
fig = plots.runtime_rank_plot(result["measured"], result["label"])
run.save_figure(fig, "runtime_per_rank", "Measured expert-compute seconds per rank and policy",
                source="measured", hardware=result["hardware"])
"""),
    ],
)

# ---- 09 RL workload -----------------------------------------------------------------------------
SPECS["09_rl_workload"] = dict(
    title="09 - A real RL workload: reward and routing dynamics",
    intro="""
The synthetic traces stand in for the paper's RL runs. Here the kit runs a **real** one on the CPU:
a tiny MoE language model trained with a GRPO-style loop on verifiable synthetic tasks
(`relibra.rl`). Rollout records every generated token's top-k experts per layer; training replays
them. The routing it records is a real RoutingTrace.

We plot the reward over steps, then the same routing statistics as notebook 01 on the real trace,
next to the synthetic generator's, and finally how the policies balance it (simulated on the
`cpu-gloo` preset: the tiny model's scale).
""",
    extra_params='''\
rl_steps = None       # GRPO steps of the RL run (default: the profile's)''',
    extra_args=("rl_steps",),
    body=[
        code("""
rl = ex.rl_workload(cfg)
run.save_csv(rl["rewards"], "rewards", "reward per RL step")
rl["rewards"].tail()
"""),
        code("""
fig = plots.reward_plot(rl["rewards"], rl["label"])
run.save_figure(fig, "reward", "Mean reward per GRPO step of the tiny MoE policy", source="measured",
                hardware=rl["hardware"])
"""),
        md("""
## Routing dynamics of the real trace

Expert load per micro-batch and per step (layer 0), and how far hot experts shift, next to a
synthetic trace of the same model shape (at the generator's default tokens per micro-batch and rank).
"""),
        code("""
loads = ex.expert_load_table(rl["trace"], step=0, layer=0)
run.save_csv(loads, "expert_load", "tokens per expert of the real RL trace, layer 0")
fig = plots.expert_load_heatmaps(loads, rl["label"])
run.save_figure(fig, "expert_load_heatmaps", "Expert load share of the real RL trace per micro-batch and per step",
                source="real", hardware=rl["hardware"])
"""),
        code("""
shift = ex.shift_table(rl["traces"])
run.save_csv(shift, "shift_stats", "hot-expert overlap and load correlation: real RL trace vs synthetic")
fig = plots.shift_bars(shift, rl["label"])
run.save_figure(fig, "shift", "How far hot experts shift in the real RL trace vs a synthetic one", source="real",
                hardware=rl["hardware"])
shift.pivot_table(index="comparison", columns=["metric", "trace"], values="value").round(3)
"""),
        md("""
## Balancing the real trace

The policies on the real trace, priced by the simulator on the `cpu-gloo` preset (the tiny model's
scale). The trace holds only tens of tokens per expert, so ReLibra's minimum tokens per replica is set
to the preset's GEMM half-saturation point (`rl["sim_policy_params"]`) instead of its paper-scale default.
"""),
        code("""
sim = ex.simulate_trace(cfg, rl["trace"], cluster="cpu-gloo", workload="rl", policy_params=rl["sim_policy_params"])
run.save_csv(sim, "balancing", "simulated throughput and skewness of each policy on the real RL trace")
fig = plots.policy_summary_plot(sim, rl["sim_label"], title="Balancing the real RL trace")
run.save_figure(fig, "balancing", "Simulated throughput and rank skewness of each policy on the real RL trace",
                source="simulated", hardware="cpu-gloo")
sim
"""),
    ],
)
