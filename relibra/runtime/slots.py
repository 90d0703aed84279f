"""The physical expert slots of a model built with relibra.runtime.spec, as the placement sees them.

Every MoE layer of the model (module order = the plan's layer order) holds, on rank g, E / ep home
slots (the experts homed on g, in increasing expert id) and then R replica slots. Two layouts:
  SequentialMLP (OccupiedSequentialMLP)  one MLP module per slot; the R replica MLP modules are ONE
                                         set shared by all layers (the layer-shared replica buffer):
                                         each layer's local_experts holds the same R module objects
                                         at positions E / ep .. E / ep + R - 1.
  TEGroupedMLP (OccupiedGroupedMLP)      each grouped linear layer holds one parameter per slot
                                         (weight{i}); a slot is a GroupedMember (the layer's experts,
                                         i). Replica members E / ep .. E / ep + R - 1 of every layer
                                         start as the same R parameter pairs (shared like the modules);
                                         the replica buffer gives each layer's members their own leaves
                                         per forward.
Either way a slot's parameters are `mlp_params(slot)` = [fc1 weight, fc2 weight].
"""

from __future__ import annotations

import re

import numpy as np
import torch
from megatron.core.transformer.moe.moe_layer import MoELayer

from relibra.errors import ConfigError
from relibra.runtime.placement import local_home_experts
from relibra.runtime.router import PlacementRouter
from relibra.runtime.spec import OccupiedGroupedMLP, OccupiedSequentialMLP


def moe_layers(model) -> list:
    """megatron-core MoELayers of `model` whose router is ReLibra's, in module order."""
    return [m for _, m in _named_moe_layers(model)]


def _named_moe_layers(model) -> list:
    layers = [(name, m) for name, m in model.named_modules()
              if isinstance(m, MoELayer) and isinstance(m.router, PlacementRouter)]
    if not layers:
        raise ConfigError("the model holds no MoELayer built from a spec wrapped by relibra.runtime.spec.wrap_moe_spec")
    for name, m in layers:
        if not isinstance(m.experts, (OccupiedSequentialMLP, OccupiedGroupedMLP)):
            raise ConfigError(f"{name or 'the model'}: the experts are {type(m.experts).__name__}, not "
                              "OccupiedSequentialMLP or OccupiedGroupedMLP (wrap the spec with "
                              "relibra.runtime.spec.wrap_moe_spec)")
    return layers


def logical_state_dict(model, gather: bool = False) -> dict:
    """The model's state dict named as a stock megatron-core model of the same spec names it at EP 1:
    every routed expert under `<layer>.experts.local_experts.<e>.` (grouped experts:
    `<layer>.experts.linear_fc1.weight<e>`, TE's names) with e its LOGICAL id, replica slots left out.
    This is what a per-step weight push to a rollout engine (SGLang, vLLM) or a Hugging Face
    conversion reads: the slot an expert sits in never shows.

    gather=False: this rank's home experts (and every dense tensor), a rank's share of the push;
    gather=True: every logical expert on every rank, all-gathered over each layer's EP group
    (collective: every EP rank calls it). Values are detached (the live tensors when not gathered)."""
    layers = _named_moe_layers(model)
    state = model.state_dict(keep_vars=False)
    per_layer = [_home_slot_tensors(name, moe.experts) for name, moe in layers]
    slot_keys = set().union(*(keys for _, _, keys in per_layer))
    out = {key: value for key, value in state.items() if key not in slot_keys}
    for (name, moe), (ids, local, _) in zip(layers, per_layer):
        group = moe.experts.ep_group
        if not gather or group.size() == 1:
            for template, tensors in local.items():
                for e, t in zip(ids, tensors):
                    out[template.format(e=int(e))] = t
            continue
        size = group.size()
        mine = torch.tensor(ids, dtype=torch.int64, device=next(iter(local.values()))[0].device)
        all_ids = [torch.empty_like(mine) for _ in range(size)]
        torch.distributed.all_gather(all_ids, mine, group=group)
        all_ids = torch.cat(all_ids).tolist()
        for template, tensors in local.items():
            if not all(torch.is_tensor(t) and t.shape == tensors[0].shape for t in tensors):
                # per-module extra state (None for megatron's local linear layers): not expert data
                for e in all_ids:
                    out[template.format(e=int(e))] = tensors[0]
                continue
            stacked = torch.stack([t.detach() for t in tensors]).contiguous()
            parts = [torch.empty_like(stacked) for _ in range(size)]
            torch.distributed.all_gather(parts, stacked, group=group)
            for e, t in zip(all_ids, torch.cat(parts)):
                out[template.format(e=int(e))] = t
    return out


_GROUPED_MEMBER = re.compile(r"^(linear_fc[12])\.(weight|bias)(\d+)$")


def _home_slot_tensors(name: str, experts) -> tuple[list[int], dict[str, list], set[str]]:
    """(logical ids of the home slots, {key template with {e}: [tensor of each home slot]}, every state
    key of the layer's routed slots, homes and replicas) of one layer's experts."""
    if experts.logical_experts is None:
        raise ConfigError(f"{name}: its slots have no logical labels yet; build relibra.runtime.hook.ReLibraHook "
                          "(or relibra.runtime.slots.ExpertSlots) on the model first")
    ids, _ = experts.logical_experts
    base = f"{name}.experts." if name else "experts."
    state = experts.state_dict(keep_vars=False)
    local: dict[str, list] = {}
    if isinstance(experts, OccupiedGroupedMLP):
        # TE's grouped layout: a stock model at EP 1 names expert e's fc1 weight `linear_fc1.weight{e}`
        members = {k: _GROUPED_MEMBER.match(k) for k in state}
        for key, match in sorted(members.items(), key=lambda kv: kv[0]):
            if match and int(match.group(3)) < len(ids):
                local.setdefault(f"{base}{match.group(1)}.{match.group(2)}{{e}}", [None] * len(ids))[
                    int(match.group(3))] = state[key]
        return ids, local, {base + k for k, m in members.items() if m}
    for slot in range(len(ids)):
        for suffix, t in experts.local_experts[slot].state_dict(keep_vars=False).items():
            local.setdefault(f"{base}local_experts.{{e}}.{suffix}", []).append(t)
    return ids, local, {base + k for k in state if k.startswith("local_experts.")}


class GroupedMember:
    """Slot `index` of a grouped-GEMM layer (OccupiedGroupedMLP): member `index` of its linear_fc1 and
    linear_fc2, read when asked (the replica buffer replaces replica members' parameters)."""

    def __init__(self, experts, index: int):
        self.experts = experts
        self.index = index

    def params(self) -> list[torch.nn.Parameter]:
        return [getattr(self.experts.linear_fc1, f"weight{self.index}"),
                getattr(self.experts.linear_fc2, f"weight{self.index}")]

    def set_params(self, fc1: torch.nn.Parameter, fc2: torch.nn.Parameter) -> None:
        setattr(self.experts.linear_fc1, f"weight{self.index}", fc1)
        setattr(self.experts.linear_fc2, f"weight{self.index}", fc2)


class ExpertSlots:
    """Home and replica slots of every MoE layer of `model` on this rank.

    home: int [L, E] current placement (the static contiguous one at build time); replica_slots: R.
    Shares the replica modules across layers and zeroes them (a replica holds no weights of its own).
    """

    def __init__(self, model, ep_group, home: np.ndarray, replica_slots: int):
        self.moes = moe_layers(model)
        self.routers = [m.router for m in self.moes]
        self.ep = ep_group.size()
        self.rank = ep_group.rank()
        self.num_layers, self.num_experts = np.shape(home)
        if len(self.moes) != self.num_layers:
            raise ConfigError(f"the model has {len(self.moes)} ReLibra MoE layers; the placement has {self.num_layers}")
        self.homes_per_rank = self.num_experts // self.ep
        self.replica_slots = replica_slots
        if self.moes[0].experts.num_local_experts != self.homes_per_rank + replica_slots:
            raise ConfigError(f"the model has {self.moes[0].experts.num_local_experts} slots per rank; "
                              f"{self.homes_per_rank} homes + {replica_slots} replica slots expected "
                              "(relibra.runtime.spec.physical_config)")
        self.grouped = isinstance(self.moes[0].experts, OccupiedGroupedMLP)
        if self.grouped:
            if any(getattr(m.experts.linear_fc1, "use_bias", False) or getattr(m.experts.linear_fc2, "use_bias", False)
                   for m in self.moes):
                raise ConfigError("grouped experts with biases (add_bias_linear=True): ReLibra moves and replicates "
                                  "expert weights only; build the experts without bias")
            # the layers' replica members start as layer 0's parameters, as the shared modules below
            shared = [GroupedMember(self.moes[0].experts, self.homes_per_rank + r) for r in range(replica_slots)]
            for moe in self.moes[1:]:
                for r, member in enumerate(shared):
                    GroupedMember(moe.experts, self.homes_per_rank + r).set_params(*member.params())
        else:
            shared = [self.moes[0].experts.local_experts[self.homes_per_rank + r] for r in range(replica_slots)]
            for moe in self.moes[1:]:
                for r, mlp in enumerate(shared):
                    moe.experts.local_experts[self.homes_per_rank + r] = mlp
        self.replica_mlps = shared
        with torch.no_grad():
            for p in self.replica_parameters():
                p.zero_()
        self.home = home

    @property
    def home(self) -> np.ndarray:
        """int64 [L, E]: the rank homing each logical expert now."""
        return self._home

    @home.setter
    def home(self, home: np.ndarray) -> None:
        self._home = np.asarray(home, dtype=np.int64).copy()
        # Each layer's experts read their slots' logical ids from this placement whenever they are asked
        # (OccupiedSequentialMLP.logical_experts), so checkpoints and logical_state_dict name the experts
        # the slots hold now, after any migration.
        for layer, moe in enumerate(self.moes):
            moe.experts.placement = (self, layer)

    def home_mlps(self, layer: int) -> list:
        """This rank's home slots of `layer` in slot order: MLP modules, or GroupedMembers."""
        experts = self.moes[layer].experts
        if self.grouped:
            return [GroupedMember(experts, i) for i in range(self.homes_per_rank)]
        return list(experts.local_experts[: self.homes_per_rank])

    def set_replica_params(self, layer: int, slot: int, fc1: torch.nn.Parameter, fc2: torch.nn.Parameter) -> None:
        """Make `fc1`, `fc2` the weights replica slot `slot` of `layer` computes with (the shared
        module's weights for SequentialMLP, layer `layer`'s members for grouped experts)."""
        if self.grouped:
            GroupedMember(self.moes[layer].experts, self.homes_per_rank + slot).set_params(fc1, fc2)
        else:
            mlp = self.replica_mlps[slot]
            mlp.linear_fc1.weight, mlp.linear_fc2.weight = fc1, fc2

    def local_experts(self, layer: int) -> np.ndarray:
        """Logical ids of the experts homed here in `layer`, in slot order: int64 [E / ep]."""
        return local_home_experts(self.home[layer: layer + 1], self.rank)[0]

    @staticmethod
    def mlp_params(mlp) -> list[torch.nn.Parameter]:
        """[fc1 weight, fc2 weight] of a slot (an MLP module or a GroupedMember)."""
        if isinstance(mlp, GroupedMember):
            return mlp.params()
        return [mlp.linear_fc1.weight, mlp.linear_fc2.weight]

    def home_expert_parameters(self) -> list[torch.nn.Parameter]:
        return [p for layer in range(self.num_layers) for mlp in self.home_mlps(layer) for p in self.mlp_params(mlp)]

    def replica_parameters(self) -> list[torch.nn.Parameter]:
        return [p for mlp in self.replica_mlps for p in self.mlp_params(mlp)]

    def load_logical_weights(self, weights) -> None:
        """Fill every home slot from weights(layer, expert) -> (fc1, fc2) for the current placement."""
        with torch.no_grad():
            for layer in range(self.num_layers):
                for mlp, expert in zip(self.home_mlps(layer), self.local_experts(layer)):
                    for p, w in zip(self.mlp_params(mlp), weights(layer, int(expert))):
                        p.copy_(w)
