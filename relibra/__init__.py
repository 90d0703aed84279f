"""ReLibra reproduction kit: routing-replay-guided load balancing for MoE training in RL.

Modules: trace (routing traces), workloads (synthetic RL routing), importers, cluster (model and
topology presets), plan (StepPlan), policies (every balancer), sim (cost model and simulator),
runtime (megatron-core + torch.distributed), rl (a small real RL workload), experiments and plots
(what the notebooks call), cli.
"""

__version__ = "0.1.0"
