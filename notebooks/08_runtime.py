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
# with the gloo backend, ranks grouped into simulated nodes; under the `gpu` profile the notebook reads
# the metrics that the same entry point wrote on GPU nodes (NCCL) from `measured_dir`.
#
# For `megatron` and `relibra` on a skewed trace we put the **measured** per-rank expert-compute time
# and step time next to the simulator's prediction for the `cpu-gloo` preset (calibrated to this
# machine). Measurements on shared cores are noisy: the spread over repeats is shown.

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
result = ex.runtime_comparison(cfg)
run.save_csv(result["measured"], "measured", "measured per-rank metrics of the runtime (metrics schema)")
run.save_csv(result["comparison"], "runtime_vs_sim", "measured vs simulated seconds per policy and component")
result["comparison"]

# %%
fig = plots.runtime_vs_sim_plot(result["comparison"], result["label"])
run.save_figure(fig, "runtime_vs_sim", "Measured runtime vs simulated prediction: expert compute and step time "
                "per policy", source="measured", hardware=result["hardware"])

# %% [markdown]
# Per rank: the measured expert-compute time of each rank next to the simulator's for the same rank
# (where the experiment's data frame holds per-rank simulated rows).

# %%
fig = plots.runtime_rank_plot(result["measured"], result["label"], simulated=result.get("simulated"))
run.save_figure(fig, "runtime_per_rank", "Expert-compute seconds per rank and policy: measured, and simulated "
                "where the simulator gives per-rank figures", source="measured", hardware=result["hardware"])

# %% [markdown]
# ## What the numbers say

# %%
nr.show(nr.runtime_story(result["comparison"]))
run.finish()
print("figures:", [f["name"] for f in run.figures])
