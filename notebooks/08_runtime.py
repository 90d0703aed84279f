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
# The simulator prices plans; the runtime (`relibra.runtime`) **executes** them: a small MoE
# transformer built from megatron-core layers, trained with AdamW under torch.distributed, where the
# same StepPlan decides expert homes, replica copies and token splits. On this CPU machine it runs
# with the gloo backend (one rank per core by default), on the expert-dominated `moe-cpu` preset; under
# the `gpu` profile the notebook reads the metrics that the same entry point wrote on GPU nodes.
#
# Each policy trains on the same data from the same seed. We put the **measured** median step time
# (whiskers: min-max over timed steps and repeats) next to the simulator's `sim_step_s` for the same
# trace and plans on the `cpu-gloo-fit` preset, fitted on this machine from micro-benchmarks
# (`relibra calibrate`), never from these runs. Whether the two agree is computed below from the
# numbers. Runs with more ranks than cores are labelled OVERSUBSCRIBED and say nothing about speed.
# Times taken while other jobs share the cores are noisy.

# %% tags=["parameters"]
profile = "laptop"   # tiny | laptop (default) | paper | gpu: the runtime's model, steps and repeats
policies = None      # comma-separated policy names (None: megatron,relibra)
seed = 0             # same seed, same trace and plans (measured times still vary)
out_dir = None       # default: results/08_runtime
measured_dir = None  # gpu profile: folder of measured runs (None: the profile's, results/gpu_runs)
nproc = None         # ranks of the gloo run (None: the profile's)
nodes = None         # simulated nodes the ranks are grouped into (None: the profile's)

# %%
from relibra import experiments as ex, plots
from relibra.experiments import narrative as nr

run = ex.start("08_runtime", globals())  # unknown or out-of-range parameters fail here
cfg = run.config
print(cfg.scale_note())

# %%
result = run.compute()
result.step_results

# %%
if len(result.step_results):  # the gpu profile reads metrics files only: no per-policy step results
    fig = plots.runtime_step_plot(result.step_results, result.label)
    run.save_figure(fig, "runtime_step_vs_sim", "Measured median step time (min-max whiskers) next to the "
                    "simulated step time per policy", source="measured", hardware=result.hardware)

# %% [markdown]
# ## Measured against simulated, from the numbers above

# %%
nr.show(nr.runtime_agreement(result.step_results) if len(result.step_results) else "No per-policy step results.")

# %% [markdown]
# ## The reference measurement, on an idle machine
#
# The run above shares the machine with whatever else runs during a reproduction. The kit also ships
# one measurement taken on an idle machine, `data/runtime_measured.json`, written by
# `scripts/measure_runtime.py --calibrate --repeats 3`: the CPU preset refitted from micro-benchmarks,
# then each command launched three times. Its `sim_step_s` is the simulator's prediction at the time,
# from that fit. Both node layouts: 1 node x 2 ranks (reordering and in-node replication) and
# 2 nodes x 1 rank (reordering only).

# %%
recorded, where = ex.recorded_runtime()
print(f"recorded {where['date']} on {where['machine']['cpus']} cores ({where['machine']['processor']}), "
      f"1-min load {recorded['load_before'].min():.1f}-{recorded['load_after'].max():.1f}")
for layout, rows in recorded.groupby("nodes_x_ranks", sort=False):
    print(f"\n{layout} (nodes x ranks per node): {rows['command'].iloc[0]}")
    nr.show(nr.runtime_agreement(rows))
recorded[["nodes_x_ranks", "launch", "policy", "step_s_median", "step_s_min", "step_s_max", "sim_step_s",
          "token_skew", "expert_share"]].round(3)

# %% [markdown]
# Per component: expert compute, all-to-all and the whole step, measured and simulated.

# %%
fig = plots.runtime_vs_sim_plot(result.runtime_vs_sim, result.label)
run.save_figure(fig, "runtime_vs_sim", "Measured runtime vs simulated prediction: expert compute, all-to-all and "
                "step time per policy", source="measured", hardware=result.hardware)

# %% [markdown]
# Per rank: the measured expert-compute time of each rank next to the simulator's for the same rank.

# %%
fig = plots.runtime_rank_plot(result.measured, result.label, simulated=result.simulated)
run.save_figure(fig, "runtime_per_rank", "Expert-compute seconds per rank and policy: measured, and simulated "
                "where the simulator gives per-rank figures", source="measured", hardware=result.hardware)

# %% [markdown]
# ## Per component

# %%
nr.show(nr.runtime_story(result.runtime_vs_sim))
run.finish()
print("figures:", [f["name"] for f in run.figures])
