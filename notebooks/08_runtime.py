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
# # 08 - The real runtime next to the simulator
#
# The simulator prices plans; the runtime (`relibra.runtime`) **executes** them. Its model is
# megatron-core's own `GPTModel`, built from megatron's local layer spec (embedding, rotary attention,
# RMSNorm, output layer), with ReLibra entering as a MoE submodule spec and a three-call step hook
# (docs/integration.md). The same StepPlan decides expert homes, replica copies and token splits. On
# this CPU machine it runs over gloo, one rank per core, on the expert-dominated `moe-cpu` preset; under
# the `gpu` profile the notebook reads the summaries the same command wrote on GPU nodes.
#
# **How it is measured.** Policies alternate step by step inside one launch (Megatron, ReLibra,
# Megatron, ReLibra, ...), each on the same step of data, so that whatever else the machine does hits
# both alike. The speed-up is the ratio of the two policies' median step times, with a paired
# bootstrap 95% interval over the timed steps. Before each all-to-all and each replica transfer every
# rank waits at a timed barrier: what a rank spends there is **waiting** for the slowest rank, and the
# transfer after it is its own work. Next to each measured segment stands the simulator's figure for the
# same plans on the `cpu-gloo-fit` preset, fitted on this machine from micro-benchmarks
# (`relibra calibrate`), never from these runs. Runs with more ranks than cores are labelled
# OVERSUBSCRIBED and say nothing about speed.

# %% tags=["parameters"]
profile = "laptop"   # tiny | laptop (default) | paper | gpu: the runtime's model, steps and launches
policies = None      # comma-separated policy names (None: megatron,relibra)
seed = 0             # same seed, same trace and plans (measured times still vary)
out_dir = None       # default: results/interactive/08_runtime
measured_dir = None  # gpu profile: folder of measured runs (None: the profile's, results/gpu_runs)
nproc = None         # ranks of the gloo run (None: the profile's)
nodes = None         # simulated nodes the ranks are grouped into (None: the profile's)

# %%
from relibra import experiments as ex, plots
from relibra.runtime.measure import WAITING, runtime_agreement, runtime_segments_story

run = ex.start("08_runtime", globals())  # unknown or out-of-range parameters fail here
print(run.scale_note())

# %%
result = run.compute()
result.step_results[["repeat", "policy", "step_s_median", "sim_step_s", "speedup_vs_megatron", "speedup_ci_low",
                     "speedup_ci_high", "sim_speedup_vs_megatron"]].round(3)

# %% [markdown]
# ## One training step, segment by segment
#
# Each panel is one policy's step: the measured seconds of each segment (upper bar) beside the
# simulator's (lower bar, hatched). Waiting is drawn as its own dark segment. The simulator has no
# waiting segment: it charges each layer's slowest GPU for the expert work, which is what the others
# wait for.

# %%
fig = plots.runtime_step_segments_plot(result.step_segments, result.label, WAITING)
run.save_figure(fig, "runtime_step_segments", "Whole training step per policy in segments (waiting for the other "
                "ranks its own segment), measured beside simulated", source="measured", hardware=result.hardware)
ex.show(runtime_segments_story(result.step_segments, WAITING))

# %% [markdown]
# Process CPU time per rank beside its wall time (median over timed steps): a rank whose CPU time is
# well below its wall time spent the difference waiting or descheduled.

# %%
result.rank_times.round(3)

# %% [markdown]
# ## The speed-up and its interval, measured against simulated

# %%
ex.show(runtime_agreement(result.step_results))

# %% [markdown]
# ## The reference measurement
#
# The run above shares the machine with whatever else runs during a reproduction. The kit also ships
# one measurement, `data/runtime_measured.json`, written by `scripts/measure_runtime.py --calibrate
# --repeats 3`: the CPU preset refitted from micro-benchmarks, then each command launched three times,
# each launch alternating the policies step by step. Both node layouts: 1 node x 2 ranks (reordering and
# in-node replication) and 2 nodes x 1 rank (reordering only). The file records the machine's load.

# %%
recorded = result.recorded_step_results
if len(recorded):
    print(f"recorded {recorded['date'].iloc[0]} on {recorded['cpus'].iloc[0]} cores, 1-min load "
          f"{recorded['load_before'].min():.1f}-{recorded['load_after'].max():.1f}")
    for layout, rows in recorded.groupby("nodes_x_ranks", sort=False):
        print(f"\n{layout} (nodes x ranks per node): {rows['command'].iloc[0]}")
        ex.show(runtime_agreement(rows))

# %%
fig = plots.runtime_speedup_plot(result.step_results, result.label, recorded)
run.save_figure(fig, "runtime_speedup", "Speed-up over Megatron per launch with its paired bootstrap 95% interval, "
                "and the simulated speed-up", source="measured", hardware=result.hardware)

# %% [markdown]
# Per rank: the measured expert-compute time of each rank (what the other ranks wait for).

# %%
if len(result.measured):
    fig = plots.runtime_rank_plot(result.measured, result.label)
    run.save_figure(fig, "runtime_per_rank", "Measured expert-compute seconds per rank and policy", source="measured",
                    hardware=result.hardware)
run.finish()
print("figures:", [f["name"] for f in run.figures])
