"""The physical expert slots of a model built with relibra.runtime.spec, as the placement sees them.

Every MoE layer of the model (module order = the plan's layer order) holds, on rank g, E / ep home
slots (the experts homed on g, in increasing expert id) and then R replica slots. The R replica MLP
modules are ONE set shared by all layers (the layer-shared replica buffer): each layer's
local_experts holds the same R module objects at positions E / ep .. E / ep + R - 1.
"""

from __future__ import annotations

import numpy as np
import torch
from megatron.core.transformer.moe.moe_layer import MoELayer

from relibra.errors import ConfigError
from relibra.runtime.placement import local_home_experts
from relibra.runtime.router import PlacementRouter
from relibra.runtime.spec import OccupiedSequentialMLP


def moe_layers(model) -> list:
    """megatron-core MoELayers of `model` whose router is ReLibra's, in module order."""
    return [m for _, m in _named_moe_layers(model)]


def _named_moe_layers(model) -> list:
    layers = [(name, m) for name, m in model.named_modules()
              if isinstance(m, MoELayer) and isinstance(m.router, PlacementRouter)]
    if not layers:
        raise ConfigError("the model holds no MoELayer built from a spec wrapped by relibra.runtime.spec.wrap_moe_spec")
    for name, m in layers:
        if not isinstance(m.experts, OccupiedSequentialMLP):
            raise ConfigError(f"{name or 'the model'}: the experts are {type(m.experts).__name__}, not "
                              "OccupiedSequentialMLP (wrap the spec with relibra.runtime.spec.wrap_moe_spec)")
    return layers


def logical_state_dict(model, gather: bool = False) -> dict:
    """The model's state dict named as a stock megatron-core model of the same spec names it at EP 1:
    every routed expert under `<layer>.experts.local_experts.<e>.` with e its LOGICAL id, replica slots
    left out. This is what a per-step weight push to a rollout engine (SGLang, vLLM) or a
    Hugging Face conversion reads: the slot an expert sits in never shows.

    gather=False: this rank's home experts (and every dense tensor), a rank's share of the push;
    gather=True: every logical expert on every rank, all-gathered over each layer's EP group
    (collective: every EP rank calls it). Values are detached (the live tensors when not gathered)."""
    layers = _named_moe_layers(model)
    state = model.state_dict(keep_vars=False)
    out = {}
    expert_prefixes = [f"{name}.experts.local_experts." if name else "experts.local_experts." for name, _ in layers]
    for key, value in state.items():
        if not any(key.startswith(p) for p in expert_prefixes):
            out[key] = value
    for (name, moe), prefix in zip(layers, expert_prefixes):
        experts = moe.experts
        if experts.logical_experts is None:
            raise ConfigError(f"{name}: its slots have no logical labels yet; build relibra.runtime.hook.ReLibraHook "
                              "(or relibra.runtime.slots.ExpertSlots) on the model first")
        ids, _ = experts.logical_experts
        local = {}  # parameter suffix -> [tensor of each home slot]
        for slot in range(len(ids)):
            for suffix, t in experts.local_experts[slot].state_dict(keep_vars=False).items():
                local.setdefault(suffix, []).append(t)
        if not gather or experts.ep_group.size() == 1:
            for suffix, tensors in local.items():
                for e, t in zip(ids, tensors):
                    out[f"{prefix}{int(e)}.{suffix}"] = t
            continue
        group = experts.ep_group
        size = group.size()
        mine = torch.tensor(ids, dtype=torch.int64, device=next(iter(local.values()))[0].device)
        all_ids = [torch.empty_like(mine) for _ in range(size)]
        torch.distributed.all_gather(all_ids, mine, group=group)
        all_ids = torch.cat(all_ids).tolist()
        for suffix, tensors in local.items():
            if not all(torch.is_tensor(t) and t.shape == tensors[0].shape for t in tensors):
                # per-module extra state (None for megatron's local linear layers): not expert data
                for e in all_ids:
                    out[f"{prefix}{int(e)}.{suffix}"] = tensors[0]
                continue
            stacked = torch.stack([t.detach() for t in tensors]).contiguous()
            parts = [torch.empty_like(stacked) for _ in range(size)]
            torch.distributed.all_gather(parts, stacked, group=group)
            for e, t in zip(all_ids, torch.cat(parts)):
                out[f"{prefix}{int(e)}.{suffix}"] = t
    return out


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
        """This rank's home-slot MLP modules of `layer`, in slot order."""
        return list(self.moes[layer].experts.local_experts[: self.homes_per_rank])

    def local_experts(self, layer: int) -> np.ndarray:
        """Logical ids of the experts homed here in `layer`, in slot order: int64 [E / ep]."""
        return local_home_experts(self.home[layer: layer + 1], self.rank)[0]

    @staticmethod
    def mlp_params(mlp) -> list[torch.nn.Parameter]:
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
