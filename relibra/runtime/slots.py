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


def moe_layers(model) -> list:
    """megatron-core MoELayers of `model` whose router is ReLibra's, in module order."""
    layers = [m for m in model.modules() if isinstance(m, MoELayer) and isinstance(m.router, PlacementRouter)]
    if not layers:
        raise ConfigError("the model holds no MoELayer built from relibra.runtime.spec.moe_layer_spec")
    return layers


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
        self.home = np.asarray(home, dtype=np.int64).copy()
        self.num_layers, self.num_experts = self.home.shape
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
