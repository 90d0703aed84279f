"""ReLibra as megatron-core module specs: the MoE submodule a Megatron-LM user drops into a layer spec.

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    layer_spec = get_gpt_layer_local_spec(num_experts=E, normalization="RMSNorm")
    layer_spec.submodules.mlp = moe_layer_spec(num_experts=E)
    model = GPTModel(physical_config(config, ep, replica_slots), layer_spec, ...)

The layer is megatron-core's own MoELayer (alltoall dispatcher), so TransformerLayer builds it with the
model's process groups as it builds any MoELayer. Two parts differ from megatron's local MoE spec:
  router   PlacementRouter: scores the E logical experts, answers over the physical slots (every
           rank's E / ep home slots, then its R replica slots) as the step's plan says
           (relibra.runtime.router);
  experts  OccupiedSequentialMLP: megatron's SequentialMLP that skips slots holding no tokens, so an
           empty replica slot costs nothing.
The model's config therefore counts physical slots (`physical_config`); the router sizes itself by E.
Which expert each slot holds, and the replica weights, are the step hook's business
(relibra.runtime.hook).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules
from megatron.core.transformer.spec_utils import ModuleSpec

from relibra.errors import ConfigError
from relibra.runtime.router import PlacementRouter


class OccupiedSequentialMLP(SequentialMLP):
    """SequentialMLP that runs only the local slots with tokens (an empty slot adds no GEMM).

    forward(hidden [T, H] sorted by slot, tokens_per_expert int [slots], probs [T]) -> ([T, H], None).
    """

    def forward(self, permuted_local_hidden_states: torch.Tensor, tokens_per_expert: torch.Tensor,
                permuted_probs: torch.Tensor):
        counts = tokens_per_expert.tolist()
        outputs = []
        for mlp, x, p in zip(self.local_experts, torch.split(permuted_local_hidden_states, counts),
                             torch.split(permuted_probs, counts)):
            if x.shape[0]:
                outputs.append(mlp(x, p)[0])
        if not outputs:
            return permuted_local_hidden_states[:0] * 0.0, None
        return torch.cat(outputs, dim=0), None


def moe_layer_spec(num_experts: int) -> ModuleSpec:
    """megatron-core MoELayer spec with ReLibra's placement router and slot experts.

    num_experts: logical experts E (the router's width). The model config's num_moe_experts must count
    physical slots, ep * (E / ep + replica_slots) (see physical_config).
    """
    experts = ModuleSpec(module=OccupiedSequentialMLP,
                         submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear))
    router = functools.partial(PlacementRouter, num_experts=num_experts)
    return ModuleSpec(module=MoELayer, submodules=MoESubmodules(experts=experts, router=router))


def gpt_layer_spec(num_experts: int) -> ModuleSpec:
    """megatron-core's local GPT layer spec (RMSNorm, causal self-attention) with moe_layer_spec as its MLP."""
    # megatron-core's GPT layer specs warn at import (no Apex); they load here, once a rank has set its
    # warning filters (relibra.runtime.quiet): ranks import this module while unpickling their function.
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(num_experts=num_experts, normalization="RMSNorm")
    spec.submodules.mlp = moe_layer_spec(num_experts)
    return spec


def physical_config(config, ep: int, replica_slots: int):
    """`config` (logical: num_moe_experts = E) with num_moe_experts = ep * (E / ep + replica_slots)."""
    experts = config.num_moe_experts
    if experts is None or experts % ep:
        raise ConfigError(f"{ep} EP ranks do not divide the {experts} experts of the model config")
    if replica_slots < 0:
        raise ConfigError(f"replica slots must be >= 0, got {replica_slots}")
    return dataclasses.replace(config, num_moe_experts=ep * (experts // ep + replica_slots))
