"""The cost model: seconds for one StepPlan on one cluster, per micro-batch, layer, phase and component.

Every policy is charged by the same functions; a policy shows up only through its plan (homes,
replicas, token flow) and its flags (`transfers_on_critical_path`, `uniform_routing`,
`planner_on_critical_path` with `runtime_planner`). The package, by concept (docs/cost-model.md has the derivations):

  params       CostParams: the training run's knobs (sequence length, replica buffer, dp size, ...)
  links        link and all-to-all seconds on a topology; distinct tokens under DeepEP's dedup
  flops        GEMM seconds (the half-saturation curve) and attention-core FLOPs to seconds
  phases       one function per phase: dispatch/combine, experts, dense (attention), non-MoE parts,
               stage-to-stage sends, replicas, run-time planner, migration, optimizer (on the GPU and, where
               offloaded, on the host); replica memory
  pipeline     the 1F1B and interleaved schedules over stages, with their sends
  memory       the busiest GPU's memory and whether it fits; the PCIe leg of offloaded optimizer state
  overheads    Overheads: overlap efficiency, activation recomputation, replica gradient adds, the
               post-rollout planner, plan metadata (the costs of balancing beyond its transfers' bytes)
  plan_cost    PlanCost and cost_plan, which assembles the phases into one step
  calibration  GEMM fitting from measured times; the measured planner-time table

Per-token FLOPs and bytes are defined on relibra.cluster.ModelShape and rates on Topology, the same
definitions the planners use. Imports: relibra.cluster, relibra.plan, relibra.trace, relibra.errors
(calibration reads the measured planner table; relibra.bench measures it and fits the GEMM curve).
"""

from relibra.costs.calibration import load_planner_table, planner_seconds_per_cell
from relibra.costs.flops import (attention_core_flops, attention_flops_per_token, dense_params_per_gpu,
                                 expert_flops_per_token, gemm_seconds, moe_layer_dense_flops_per_token)
from relibra.costs.links import collective_seconds, distinct_tokens, link_seconds
from relibra.costs.overheads import Overheads, overheads_from_values, plan_metadata
from relibra.costs.params import GB, PLANNER_CHARGES, REPLICA_BUFFERS, ROUTES, TFLOP, CostParams
from relibra.costs.phases import (active_copies, dense_seconds, dispatch_seconds, exposed_seconds,
                                  expert_seconds_per_gpu, migration_seconds, non_moe_seconds, optimizer_parts,
                                  optimizer_seconds, planner_on_critical_path, planner_seconds, replica_memory,
                                  replica_moves, replica_seconds, replica_transfer_seconds, stage_send_seconds)
from relibra.costs.plan_cost import PlanCost, cost_plan

__all__ = [
    "CostParams", "PlanCost", "cost_plan", "Overheads", "overheads_from_values", "plan_metadata", "GB", "TFLOP", "ROUTES", "REPLICA_BUFFERS", "PLANNER_CHARGES",
    "link_seconds", "collective_seconds", "distinct_tokens",
    "gemm_seconds", "attention_core_flops", "attention_flops_per_token", "expert_flops_per_token",
    "moe_layer_dense_flops_per_token", "dense_params_per_gpu",
    "dispatch_seconds", "active_copies", "expert_seconds_per_gpu", "dense_seconds", "non_moe_seconds",
    "replica_moves", "replica_transfer_seconds", "replica_seconds", "exposed_seconds", "replica_memory",
    "planner_on_critical_path", "planner_seconds", "migration_seconds", "optimizer_seconds", "optimizer_parts",
    "stage_send_seconds",
    "load_planner_table", "planner_seconds_per_cell",
]
