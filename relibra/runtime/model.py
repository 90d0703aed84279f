"""A small MoE transformer whose MoE blocks are megatron-core MoELayers (alltoall dispatcher,
SequentialMLP experts, the kit's PlacementRouter with megatron's RouterReplay).

Dense parts (embedding, causal self-attention, RMSNorms, output head) are plain torch and replicated
on every rank: each rank runs its own tokens through them and their gradients are all-reduced. Each
rank's tokens of a micro-batch form one sequence ([seq, batch=1] as megatron expects).

Physical layout of every MoE layer on rank g: E / ep home slots, then R replica slots. The R replica
MLP modules are ONE set shared by all layers (the layer-shared replica buffer): each layer's
SequentialMLP.local_experts holds the same R module objects at positions E/ep .. E/ep + R - 1.

Weights are initialized from the seed and the logical expert id only, so any placement of the same
seed computes the same function.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from relibra.runtime import compat
from relibra.runtime.config import ModelConfig
from relibra.runtime.placement import local_home_experts, slots_per_rank
from relibra.runtime.router import PlacementRouter, RoutingState
from relibra.runtime.timing import Timer, timed_region


def _generator(*key: int) -> torch.Generator:
    seed = 0
    for k in key:
        seed = (seed * 1_000_003 + int(k) + 7) % (2**62)
    return torch.Generator().manual_seed(seed)


def logical_expert_weights(cfg: ModelConfig, layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fc1 [2 * ffn, hidden], fc2 [hidden, ffn]) float32 of one logical expert, from the seed only."""
    h, f = cfg.hidden, cfg.shape.moe_ffn
    g = _generator(cfg.seed, 1, layer, expert)
    fc1 = torch.randn(2 * f, h, generator=g) / h**0.5
    fc2 = torch.randn(h, f, generator=g) / f**0.5
    return fc1, fc2


def _occupied_experts_forward(experts, hidden: torch.Tensor, tokens_per_expert: torch.Tensor,
                              probs: torch.Tensor):
    """SequentialMLP.forward that runs only the slots with tokens: an empty replica (or home) slot costs
    nothing. hidden [T, H] sorted by slot, tokens_per_expert int [slots], probs [T]. Returns ([T, H], None)."""
    counts = tokens_per_expert.tolist()
    outputs = []
    for mlp, x, p in zip(experts.local_experts, torch.split(hidden, counts), torch.split(probs, counts)):
        if x.shape[0]:
            outputs.append(mlp(x, p)[0])
    if not outputs:
        return hidden[:0] * 0.0, None
    return torch.cat(outputs, dim=0), None


class CausalSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.qkv = nn.Linear(hidden, 3 * heads * head_dim, bias=False)
        self.out = nn.Linear(heads * head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H]
        t = x.shape[0]
        q, k, v = self.qkv(x).view(t, 3, self.heads, self.head_dim).permute(1, 2, 0, 3)  # [3][heads, T, d]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(0, 1).reshape(t, self.heads * self.head_dim))


def _megatron_configs(cfg: ModelConfig, ep: int):
    """(physical config with ep * S slots, logical config with E experts) for megatron-core."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    shape = cfg.shape
    physical = TransformerConfig(
        num_layers=cfg.num_layers, hidden_size=shape.hidden, num_attention_heads=shape.num_attention_heads,
        num_moe_experts=ep * slots_per_rank(shape.num_experts, ep, cfg.replica_slots),
        moe_router_topk=shape.top_k, moe_ffn_hidden_size=shape.moe_ffn, ffn_hidden_size=shape.moe_ffn,
        moe_token_dispatcher_type="alltoall", moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
        moe_enable_routing_replay=True, moe_router_dtype="fp32",
        gated_linear_unit=True, activation_func=F.silu, bias_activation_fusion=False, add_bias_linear=False,
        use_cpu_initialization=True, perform_initialization=False, params_dtype=cfg.torch_dtype,
    )
    if cfg.dtype == "float64":
        physical.moe_router_dtype = "fp64"
    logical = dataclasses.replace(physical, num_moe_experts=shape.num_experts)
    return physical, logical


class MoETransformer(nn.Module):
    """Embedding -> L x [attention, MoE] blocks (pre-norm, residual) -> head.

    cfg: the model; pg_collection: megatron process groups (its ep group sets ep and this rank);
    home: int [L, E] initial placement. `forward(ids)` takes this rank's token ids [T] and returns
    logits [T, vocab]; set `self.routing` (RoutingState) and, for replicas, `self.replicas` first.
    """

    def __init__(self, cfg: ModelConfig, pg_collection, home: np.ndarray):
        super().__init__()
        compat.apply()
        from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
        from megatron.core.transformer.mlp import MLPSubmodules
        from megatron.core.transformer.moe.experts import SequentialMLP
        from megatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules
        from megatron.core.transformer.spec_utils import ModuleSpec

        self.cfg = cfg
        self.ep = pg_collection.ep.size()
        self.rank = pg_collection.ep.rank()
        shape = cfg.shape
        self.homes_per_rank = shape.num_experts // self.ep
        self.routing = RoutingState()
        self.timer = Timer()
        self.replicas = None  # a replicas.ReplicaBuffer when replicas are in use
        self.capture = None  # a list: each forward appends {"embed", "logits"} (tests)

        torch.manual_seed(cfg.seed)  # dense weights: identical on every rank and every placement
        previous_dtype = torch.get_default_dtype()
        torch.set_default_dtype(cfg.torch_dtype)
        self.embed = nn.Embedding(shape.vocab_size, shape.hidden)
        self.attn_norms = nn.ModuleList(nn.RMSNorm(shape.hidden) for _ in range(cfg.num_layers))
        self.attns = nn.ModuleList(CausalSelfAttention(shape.hidden, shape.num_attention_heads, shape.head_dim)
                                   for _ in range(cfg.num_layers))
        self.moe_norms = nn.ModuleList(nn.RMSNorm(shape.hidden) for _ in range(cfg.num_layers))
        self.final_norm = nn.RMSNorm(shape.hidden)
        self.head = nn.Linear(shape.hidden, shape.vocab_size, bias=False)
        torch.set_default_dtype(previous_dtype)

        physical, logical = _megatron_configs(cfg, self.ep)
        experts_spec = ModuleSpec(module=SequentialMLP, submodules=MLPSubmodules(
            linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear))
        self.moes = nn.ModuleList()
        for layer in range(cfg.num_layers):
            router = functools.partial(PlacementRouter, logical_config=logical, state=self.routing, layer=layer)
            moe = MoELayer(physical, MoESubmodules(experts=experts_spec, router=router),
                           layer_number=layer + 1, pg_collection=pg_collection)
            moe.route = timed_region(moe.route, self.timer, "router")
            moe.preprocess = timed_region(moe.preprocess, self.timer, "permute")
            moe.dispatch = timed_region(moe.dispatch, self.timer, "dispatch")
            moe.routed_experts_compute = timed_region(moe.routed_experts_compute, self.timer, "expert_compute",
                                                      count_tokens=True)
            moe.experts.forward = timed_region(functools.partial(_occupied_experts_forward, moe.experts), self.timer,
                                               "expert_gemm")
            moe.combine = timed_region(moe.combine, self.timer, "combine")
            self.moes.append(moe)
        # The layer-shared replica buffer: layer 0's replica MLPs serve every layer.
        shared = [self.moes[0].experts.local_experts[self.homes_per_rank + r] for r in range(cfg.replica_slots)]
        for moe in self.moes[1:]:
            for r, mlp in enumerate(shared):
                moe.experts.local_experts[self.homes_per_rank + r] = mlp
        self.replica_mlps = shared
        for mlp in shared:
            for p in mlp.parameters():
                p.data.zero_()
        # Routers: logical, seeded by layer (same on every rank and placement).
        with torch.no_grad():
            for layer, moe in enumerate(self.moes):
                g = _generator(cfg.seed, 2, layer)
                moe.router.weight.copy_(torch.randn(moe.router.weight.shape, generator=g) / shape.hidden**0.5)
        self._attention = timed_region(lambda layer, x: self.attns[layer](self.attn_norms[layer](x)), self.timer,
                                       "attention", tensor_arg=1)
        self.home = np.asarray(home, dtype=np.int64).copy()
        self.load_home_weights()
        self._dense = None
        self.dense_parameters()

    # ---- expert slots ------------------------------------------------------------------------
    def home_mlps(self, layer: int) -> list:
        """This rank's home-slot MLP modules of `layer`, in slot order."""
        return list(self.moes[layer].experts.local_experts[: self.homes_per_rank])

    def local_experts(self, layer: int) -> np.ndarray:
        """Logical ids of the experts homed here in `layer`, in slot order: int64 [E / ep]."""
        return local_home_experts(self.home[layer: layer + 1], self.rank)[0]

    @staticmethod
    def mlp_params(mlp) -> list[torch.nn.Parameter]:
        return [mlp.linear_fc1.weight, mlp.linear_fc2.weight]

    def load_home_weights(self) -> None:
        with torch.no_grad():
            for layer in range(self.cfg.num_layers):
                for mlp, expert in zip(self.home_mlps(layer), self.local_experts(layer)):
                    fc1, fc2 = logical_expert_weights(self.cfg, layer, int(expert))
                    mlp.linear_fc1.weight.copy_(fc1)
                    mlp.linear_fc2.weight.copy_(fc2)

    def home_expert_parameters(self) -> list[torch.nn.Parameter]:
        return [p for layer in range(self.cfg.num_layers) for mlp in self.home_mlps(layer)
                for p in self.mlp_params(mlp)]

    def replica_parameters(self) -> list[torch.nn.Parameter]:
        return [p for mlp in self.replica_mlps for p in self.mlp_params(mlp)]

    def dense_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters replicated on every rank (gradients all-reduced): everything but experts."""
        if self._dense is None:
            expert_ids = {id(p) for p in self.home_expert_parameters() + self.replica_parameters()}
            self._dense = [p for p in self.parameters() if id(p) not in expert_ids]
        return self._dense

    def optimizer_parameters(self) -> list[torch.nn.Parameter]:
        """What AdamW updates: dense and home experts. Replicas hold no optimizer state."""
        return self.dense_parameters() + self.home_expert_parameters()

    # ---- forward -----------------------------------------------------------------------------
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)  # [T, H]
        if self.capture is not None and x.requires_grad:
            x.retain_grad()
            self.capture.append({"embed": x})
        for layer in range(self.cfg.num_layers):
            x = x + self._attention(layer, x)
            y = self.moe_norms[layer](x)
            if self.replicas is not None:
                self.replicas.before_forward(layer, y.requires_grad)
            out, _ = self.moes[layer](y.unsqueeze(1))
            out = out.squeeze(1)
            if self.replicas is not None and out.requires_grad:
                out.register_hook(functools.partial(self.replicas.before_backward_hook, layer))
            x = x + out
        logits = self.head(self.final_norm(x))
        if self.capture is not None and self.capture:
            self.capture[-1]["logits"] = logits
        return logits
