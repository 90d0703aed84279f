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
# # 09 - A real RL workload: reward and routing dynamics
#
# **The question: does a real RL run route like the kit's synthetic traces, and how do the policies
# balance the routing it records?**
#
# The synthetic traces stand in for the paper's RL runs. Here the kit runs a **real** one on the CPU:
# a tiny MoE language model trained with a GRPO-style loop on verifiable synthetic tasks
# (`relibra.rl`). Rollout records every generated token's top-k experts per layer; training replays
# them. The routing it records is a real RoutingTrace. Below: the reward over steps, the same routing
# statistics as notebook 01 on the real trace next to the synthetic generator's, and how the policies
# balance it (simulated on the `cpu-gloo` preset: the tiny model's scale).

# %% tags=["parameters"]
profile = "laptop"  # tiny | laptop (default) | paper | gpu: RL run sizes (see relibra.experiments.RL_OVERRIDES)
policies = None     # policies simulated on the real trace (None: megatron,eplb,eplb+,relibra,balanced)
rl_steps = None     # GRPO steps of the RL run (None: the profile's)
seed = 0            # same seed, same run
out_dir = None      # default: results/interactive/09_rl_workload

# %%
from relibra import experiments as ex, plots

run = ex.start("09_rl_workload", globals())  # unknown or out-of-range parameters fail here
print(run.scale_note())
result = run.compute()
rl = result.rl

# %% [markdown]
# ## Balancing the real trace
#
# The policies on the real trace, priced by the simulator on the `cpu-gloo` preset (the tiny model's
# scale). The trace holds only tens of tokens per expert, so ReLibra's minimum tokens per replica is set
# to the preset's GEMM half-saturation point (`rl["sim_policy_params"]`) instead of its paper-scale default.
# The right panel splits each policy's simulated step into its parts, which is what explains a policy
# that balances better yet runs slower.

# %%
sim = result.balancing
fig = plots.policy_summary_plot(sim, result.sim_label, title="Balancing the real RL trace",
                                components=ex.text.step_components(sim))
run.save_figure(fig, "balancing", "Simulated throughput, rank skewness and step-time parts of each policy on the "
                f"real RL trace - {result.sim_label}", source="simulated", hardware="cpu-gloo")

# %% [markdown]
# ### What to notice

# %%
ex.show(run.story(result))

# %% [markdown]
# ### Try this
#
# The RL run is a measurement whose reward moves run to run, so this notebook makes no tested
# directional claim; `seed` and `rl_steps` give another run to compare with the figures above.

# %% [markdown]
# ## The reward
#
# Mean reward per GRPO step of the tiny policy (measured on this machine).

# %%
fig = plots.reward_plot(result.rewards, result.label)
run.save_figure(fig, "reward", f"Mean reward per GRPO step of the tiny MoE policy - {result.label}", source="measured",
                hardware=result.hardware)
result.rewards.tail()

# %% [markdown]
# ## Routing dynamics of the real trace
#
# Expert load per micro-batch and per step (layer 0), and how far hot experts shift, next to a
# synthetic trace of the same model shape (at the generator's default tokens per micro-batch and rank).

# %%
fig = plots.expert_load_heatmaps(result.expert_load, result.label)
run.save_figure(fig, "expert_load_heatmaps", "Expert load share of the real RL trace per micro-batch and per step - "
                f"{result.label}", source="real", hardware=result.hardware)

# %%
shift = result.shift_stats
fig = plots.shift_bars(shift, result.label)
run.save_figure(fig, "shift", f"How far hot experts shift in the real RL trace vs a synthetic one - {result.label}",
                source="real", hardware=result.hardware)
shift.pivot_table(index="comparison", columns=["metric", "trace"], values="value").round(3)

# %% [markdown]
# The balancing numbers, policies sorted by speed-up (fastest first):

# %%
sim.sort_values("speedup_vs_megatron", ascending=False)

# %%
run.finish()
print("figures:", [f["name"] for f in run.figures])
