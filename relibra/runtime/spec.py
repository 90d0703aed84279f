"""ReLibra in a megatron-core module spec: it wraps the MoE submodule of the spec the user already has.

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    layer_spec = wrap_moe_spec(get_gpt_layer_local_spec(num_experts=E), num_experts=E)
    model = GPTModel(physical_config(config, ep, replica_slots), layer_spec, ...)

`wrap_moe_spec` takes a layer spec (get_gpt_layer_local_spec, a TE layer spec), a block spec
(get_gpt_decoder_block_spec: its MoE layers, dense layers untouched) or a bare MoE spec, and returns a
copy in which every megatron-core MoELayer keeps its own submodules (shared experts, linear layer
classes, activation, metainfo) except two:
  router   PlacementRouter: scores the E logical experts, answers over the physical slots (every
           rank's E / ep home slots, then its R replica slots) as the step's plan says
           (relibra.runtime.router);
  experts  SequentialMLP becomes OccupiedSequentialMLP: the same per-expert MLPs (built from the
           user's linear layer classes), skipping slots that hold no tokens, so an empty replica slot
           costs nothing, and saving a checkpoint under logical expert ids (never replica slots).
  experts  TEGroupedMLP (grouped GEMM: Transformer Engine's GroupedLinear keeps one parameter
           weight{i} per local expert) becomes OccupiedGroupedMLP: the replica slots are the last R
           members of each grouped linear layer, a slot with no tokens is a zero-row member of the
           grouped GEMM, and the checkpoint names the home members by logical expert id.
The legacy GroupedMLP keeps all local experts in one weight tensor, so a replica slot could not get
weights of its own nor its gradient be pulled home; it is refused with one error that names the fix.
`check_config` refuses, at build time, the config options the plans cannot honour (token dropping,
the flex dispatcher).
The model's config counts physical slots (`physical_config`); the router sizes itself by E.
Which expert each slot holds, and the replica weights, are the step hook's business
(relibra.runtime.hook, relibra.runtime.slots).
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import torch
from megatron.core.transformer.moe.experts import SequentialMLP, TEGroupedMLP
from megatron.core.transformer.spec_utils import ModuleSpec

from relibra.errors import ConfigError
from relibra.runtime import compat
from relibra.runtime.router import SUPPORTED_DISPATCHERS, PlacementRouter, check_config, rebuild_config

GroupedMLP = compat.legacy_grouped_mlp()  # None from 0.19, which removed it

__all__ = ["SUPPORTED_DISPATCHERS", "OccupiedGroupedMLP", "OccupiedSequentialMLP", "check_config", "gpt_layer_spec",
           "moe_layer_spec", "physical_config", "wrap_moe_spec"]


class _LogicalSlots:
    """`logical_experts` names the logical expert of each home slot and the number E of logical experts,
    read from the placement of relibra.runtime.slots.ExpertSlots (which registers itself as `placement`
    = (slots, layer)); before that the slots keep megatron's static labels."""

    placement = None  # (ExpertSlots, layer index), set by ExpertSlots

    @property
    def logical_experts(self) -> tuple[list[int], int] | None:
        if self.placement is None:
            return None
        slots, layer = self.placement
        return [int(e) for e in slots.local_experts(layer)], slots.num_experts


class OccupiedSequentialMLP(_LogicalSlots, SequentialMLP):
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

    @compat.expert_tp_checkpoint_view
    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        """megatron's distributed-checkpoint view of the home slots under their LOGICAL expert ids
        (an axis of E experts), so a checkpoint loads into a stock SequentialMLP of the same E at any
        EP size; replica slots are left out (their weights are copies, their optimizer state none).

        Keys and replica ids are megatron's own (SequentialMLP.sharded_state_dict); only the expert
        offset differs: slot i holds logical expert logical_experts[0][i] instead of ep_rank * n + i."""
        if self.logical_experts is None:
            return super().sharded_state_dict(prefix, sharded_offsets, metadata)
        from megatron.core.dist_checkpointing.utils import replace_prefix_for_sharding

        metadata = compat.dp_cp_metadata(metadata)
        singleton = (metadata or {}).get("singleton_local_shards", False)
        ids, num_experts = self.logical_experts
        out = {}
        for slot, expert in enumerate(ids):
            local_prefix = f"{prefix}local_experts.{slot}."
            if singleton:
                sharded_prefix, offsets = f"{prefix}experts.{int(expert)}.", sharded_offsets
            else:
                sharded_prefix = f"{prefix}experts."
                offsets = (*sharded_offsets, (len(sharded_offsets), int(expert), num_experts))
            part = self.local_experts[slot].sharded_state_dict(local_prefix, offsets, metadata)
            replace_prefix_for_sharding(part, local_prefix, sharded_prefix)
            for sh in part.values():  # experts are replicated over expert-DP only
                sh.replica_id = (*sh.replica_id[:2], self.dp_group.rank())
            out.update(part)
        return out


class OccupiedGroupedMLP(_LogicalSlots, TEGroupedMLP):
    """megatron-core's TEGroupedMLP whose grouped linear layers hold every slot of this rank as a member:
    members 0 .. E/ep - 1 are the home slots, the last R the replica slots (weight{i} of linear_fc1
    [2 * ffn or ffn, hidden] and linear_fc2 [hidden, ffn]). The forward is TEGroupedMLP's: a slot that
    holds no tokens this micro-batch is a zero-row member of the grouped GEMM. Replica members get their
    weights and gradients from the step hook (relibra.runtime.replicas), like SequentialMLP's slots.
    """

    def __init__(self, num_local_experts, config, submodules, pg_collection=None):
        super().__init__(num_local_experts, config, submodules, pg_collection=pg_collection)
        self.dp_group = pg_collection.expt_dp if pg_collection is not None else None
        for name in ("linear_fc1", "linear_fc2"):
            linear = getattr(self, name)
            if getattr(linear, "single_grouped_weight", False) or not hasattr(linear, "weight0"):
                raise ConfigError(f"{type(linear).__name__} keeps its experts' weights in one grouped parameter "
                                  "(Transformer Engine's single_grouped_weight); ReLibra needs one parameter per "
                                  "expert (weight0 .. weightN-1): leave NVTE_GROUPED_LINEAR_SINGLE_PARAM unset")

    @compat.expert_tp_checkpoint_view
    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        """megatron's distributed-checkpoint view of the home members under their LOGICAL expert ids,
        with SequentialMLP's sharded keys (as TEGroupedMLP's own view has them, so either layout loads
        the other); replica members are left out."""
        if self.logical_experts is None:
            return super().sharded_state_dict(prefix, sharded_offsets, metadata)
        from megatron.core.transformer.mlp import apply_swiglu_sharded_factory

        metadata = compat.dp_cp_metadata(metadata)
        singleton = (metadata or {}).get("singleton_local_shards", False)
        ids, num_experts = self.logical_experts
        out = {}
        for name, tp_axis in (("linear_fc1", 0), ("linear_fc2", 1)):
            linear = getattr(self, name)
            for slot, expert in enumerate(ids):
                tensors = {"weight": getattr(linear, f"weight{slot}")}
                if getattr(linear, "use_bias", False):
                    tensors["bias"] = getattr(linear, f"bias{slot}")
                if singleton:
                    key_prefix, offsets = f"{prefix}experts.{int(expert)}.{name}.", sharded_offsets
                else:
                    key_prefix = f"{prefix}experts.{name}."
                    offsets = (*sharded_offsets, (len(sharded_offsets), int(expert), num_experts))
                part = compat.sharded_tensors_for_checkpoint(
                    tensors, key_prefix, {"weight": tp_axis, "bias": 0} if tp_axis == 0 else {"weight": 1},
                    offsets, getattr(self, "tp_group", None), metadata)  # 0.15: parallel_state's (expert TP there)
                for key, sh in part.items():
                    if name == "linear_fc1" and self.config.gated_linear_unit:
                        sh = apply_swiglu_sharded_factory(sh, offsets, singleton)
                    sh.replica_id = (*sh.replica_id[:2], self.dp_group.rank() if self.dp_group is not None else 0)
                    out[f"{prefix}{name}.{key.rsplit('.', 1)[-1]}{slot}"] = sh
        return out


def _wrap_experts(experts, where: str):
    module = experts.module if isinstance(experts, ModuleSpec) else experts
    if GroupedMLP is not None and isinstance(module, type) and issubclass(module, GroupedMLP):
        raise ConfigError(f"{where}: the experts are the legacy GroupedMLP (grouped GEMM over one weight tensor for "
                          "all local experts), so a replica slot can neither hold weights of its own nor send its "
                          "gradient home; build the spec with Transformer Engine's grouped experts (TEGroupedMLP: "
                          "moe_grouped_gemm=True, moe_use_legacy_grouped_gemm=False) or SequentialMLP "
                          "(moe_grouped_gemm=False)")
    if isinstance(module, type) and issubclass(module, (OccupiedSequentialMLP, OccupiedGroupedMLP)):
        return experts  # wrapped already
    if module is TEGroupedMLP:
        if not isinstance(experts, ModuleSpec):
            raise ConfigError(f"{where}: the experts are the bare class TEGroupedMLP; give them as a ModuleSpec with "
                              "their MLPSubmodules (linear_fc1, linear_fc2), as megatron-core's specs do")
        return dataclasses.replace(experts, module=OccupiedGroupedMLP)
    if module is not SequentialMLP:
        raise ConfigError(f"{where}: the experts are {getattr(module, '__name__', module)!r}; ReLibra wraps "
                          "megatron-core's SequentialMLP or TEGroupedMLP experts (it relabels their checkpoint by "
                          "logical expert)")
    if not isinstance(experts, ModuleSpec):
        raise ConfigError(f"{where}: the experts are the bare class SequentialMLP; give them as a ModuleSpec with "
                          "their MLPSubmodules (linear_fc1, linear_fc2), as megatron-core's specs do")
    return dataclasses.replace(experts, module=OccupiedSequentialMLP)


def wrap_moe_spec(spec, num_experts: int):
    """A copy of `spec` with every megatron-core MoELayer spec in it made ReLibra's (see the module doc).

    spec: a ModuleSpec (a TransformerLayer spec, or a MoELayer spec itself) or a TransformerBlockSubmodules
    (get_gpt_decoder_block_spec); num_experts: logical experts E (the router's width). The model config's
    num_moe_experts must count physical slots, ep * (E / ep + replica_slots) (physical_config).
    Raises ConfigError when the spec holds no MoE layer or its experts are the legacy GroupedMLP."""
    if not isinstance(num_experts, int) or isinstance(num_experts, bool) or num_experts <= 0:
        raise ConfigError(f"num_experts must be a positive integer, got {num_experts!r}")
    spec = copy.deepcopy(spec)
    found = []

    def visit(node, where):
        moe = compat.moe_spec_parts(node)  # a ModuleSpec(MoELayer), or 0.19's partial(MoELayer)
        if moe is not None:
            sub = moe[1]
            if sub is None:
                raise ConfigError(f"{where}: the MoELayer spec has no submodules")
            sub.experts = _wrap_experts(sub.experts, where)
            if compat.router_in_moe_submodules():
                sub.router = functools.partial(PlacementRouter, num_experts=num_experts)
            else:  # 0.15: MoELayer builds its router itself, by the name compat re-binds
                sub.relibra_router = functools.partial(PlacementRouter, num_experts=num_experts)
                compat.build_routers_from_submodules()
            found.append(where)
        elif isinstance(node, ModuleSpec):
            visit(node.submodules, where + ".submodules")
        elif isinstance(node, functools.partial):
            for name, value in node.keywords.items():
                visit(value, f"{where}.{name}")
        elif dataclasses.is_dataclass(node) and not isinstance(node, type):
            for f in dataclasses.fields(node):
                visit(getattr(node, f.name), f"{where}.{f.name}")
        elif isinstance(node, (list, tuple)):
            for i, item in enumerate(node):
                visit(item, f"{where}[{i}]")

    visit(spec, "spec")
    if not found:
        raise ConfigError("the spec holds no megatron-core MoELayer spec to wrap (build it with num_experts set)")
    return spec


def moe_layer_spec(num_experts: int, shared_experts: bool = True) -> ModuleSpec:
    """megatron-core's local MoE spec (get_moe_module_spec, no Transformer Engine), wrapped.

    Its shared-expert submodule is megatron's own; it is built when the config sets
    moe_shared_expert_intermediate_size."""
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec

    spec = get_moe_module_spec(use_te=False, num_experts=num_experts)
    if not shared_experts:
        spec.submodules.shared_experts = None
    return wrap_moe_spec(spec, num_experts)


def gpt_layer_spec(num_experts: int) -> ModuleSpec:
    """megatron-core's local GPT layer spec (RMSNorm, causal self-attention, MoE MLP), wrapped."""
    # megatron-core's GPT layer specs warn at import (no Apex); they load here, once a rank has set its
    # warning filters (relibra.runtime.quiet): ranks import this module while unpickling their function.
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return wrap_moe_spec(get_gpt_layer_local_spec(num_experts=num_experts, normalization="RMSNorm"), num_experts)


def physical_config(config, ep: int, replica_slots: int):
    """`config` (logical: num_moe_experts = E) with num_moe_experts = ep * (E / ep + replica_slots).

    Refuses (check_config) the options a ReLibra MoE layer cannot run."""
    experts = config.num_moe_experts
    if experts is None or experts % ep:
        raise ConfigError(f"{ep} EP ranks do not divide the {experts} experts of the model config")
    if replica_slots < 0:
        raise ConfigError(f"replica slots must be >= 0, got {replica_slots}")
    check_config(config)
    return rebuild_config(config, num_moe_experts=ep * (experts // ep + replica_slots))
