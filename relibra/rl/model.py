"""A tiny decoder-only MoE language model: the RL policy.

Plain torch, fp32, CPU. Every block is pre-norm attention followed by a routed MoE feed-forward
(no dense FFN, no shared expert). The router is Qwen3-style: softmax over all experts, top-k, then
the k probabilities renormalised to sum to one. Routing goes through a `RouterReplay` per layer
(relibra.rl.replay), so a rollout can record every token's experts and training can replay them.

Only real tokens are routed: each MoE layer takes a boolean token mask and routes `x[mask]`, in
row-major (sequence, then position) order. Padding never reaches a router, so recorded ids, replayed
ids and the routing trace all count the same tokens.

Shapes: B sequences, T positions, H hidden, E experts, K top-k, n routed tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from relibra.cluster import ModelShape
from relibra.errors import ConfigError
from relibra.rl.replay import RouterReplay
from relibra.rl.tasks import MAX_PROMPT_CHARS, MAX_RESPONSE_CHARS, PAD_ID, VOCAB_SIZE


@dataclass(frozen=True)
class PolicyConfig:
    """Shape of the policy. Defaults: 4 layers, hidden 64, 4 heads, 32 experts, top-4, expert ffn 128."""

    num_layers: int = 4
    hidden: int = 64
    num_heads: int = 4
    num_experts: int = 32
    top_k: int = 4
    moe_ffn: int = 128
    vocab_size: int = VOCAB_SIZE
    max_seq_len: int = MAX_PROMPT_CHARS + MAX_RESPONSE_CHARS + 1  # prompt + response + EOS

    def validate(self) -> None:
        for name in ("num_layers", "hidden", "num_heads", "num_experts", "top_k", "moe_ffn"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"policy: {name} must be positive, got {getattr(self, name)}")
        if self.hidden % self.num_heads:
            raise ConfigError(f"policy: num_heads={self.num_heads} does not divide hidden={self.hidden}")
        if self.top_k > self.num_experts:
            raise ConfigError(f"policy: top_k={self.top_k} exceeds num_experts={self.num_experts}")

    def model_shape(self) -> ModelShape:
        """The policy as a ModelShape (fp32 weights, Adam m and v as optimizer state).

        The default shape is the `rl-tiny` preset of relibra.cluster (so the runtime can build it
        from a trace); any other shape is named after its sizes, e.g. `rl-2x8e-top2-h32`.
        """
        default = self == PolicyConfig()
        name = "rl-tiny" if default else (f"rl-{self.num_layers}x{self.num_experts}e-top{self.top_k}-h{self.hidden}")
        return ModelShape(name, num_layers=self.num_layers, num_experts=self.num_experts, top_k=self.top_k,
                          hidden=self.hidden, moe_ffn=self.moe_ffn, num_attention_heads=self.num_heads,
                          num_kv_heads=self.num_heads, head_dim=self.hidden // self.num_heads,
                          vocab_size=self.vocab_size, bytes_per_param=4, optimizer_bytes_per_param=8)


class Attention(nn.Module):
    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden, bias=False)
        self.out = nn.Linear(cfg.hidden, cfg.hidden, bias=False)

    def forward(self, x, attn_mask, cache=None):
        """x [B, T, H]; attn_mask bool [B, 1, T, T_past + T] (True = may attend); cache (k, v) or None."""
        b, t, h = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.num_heads, h // self.num_heads).permute(2, 0, 3, 1, 4)
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.out(y.transpose(1, 2).reshape(b, t, h)), (k, v)


class Router(nn.Module):
    """Softmax-then-top-k router with record / replay (see relibra.rl.replay)."""

    def __init__(self, cfg: PolicyConfig, layer: int):
        super().__init__()
        self.top_k = cfg.top_k
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden))
        self.replay = RouterReplay(layer)

    def forward(self, x):
        """x [n, H] -> (probs [n, K] summing to 1, ids int64 [n, K], scores [n, E])."""
        scores = torch.softmax(x @ self.weight.t(), dim=-1)
        ids = self.replay.select(scores, self.top_k)
        picked = scores.gather(1, ids)  # in replay too: gradients reach the router through its own scores
        return picked / picked.sum(dim=-1, keepdim=True), ids, scores


class Experts(nn.Module):
    """E SwiGLU experts as stacked weights.

    Token-slots are grouped by expert and cut into tiles of `tile` rows (tile = the mean slots per
    expert), each tile zero-padded and tagged with its expert; all tiles then run as three batched
    GEMMs. On a CPU with tiny experts one batched call beats E small ones, and tiling keeps the
    padding under one tile per expert however skewed the routing is. Nothing is dropped.
    """

    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        e, h, f = cfg.num_experts, cfg.hidden, cfg.moe_ffn
        self.w_gate = nn.Parameter(torch.empty(e, h, f))
        self.w_up = nn.Parameter(torch.empty(e, h, f))
        self.w_down = nn.Parameter(torch.empty(e, f, h))

    def forward(self, x, probs, ids):
        """x [n, H], probs [n, K], ids [n, K] -> probability-weighted sum of the K experts' outputs [n, H]."""
        n, k = ids.shape
        e, h = self.w_gate.shape[0], x.shape[1]
        flat_ids = ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)  # token-slots grouped by expert
        token_of_slot = order // k
        expert_of_slot = flat_ids[order]
        counts = torch.bincount(flat_ids, minlength=e)
        tile = -(-n * k // e)
        tiles_per_expert = -(-counts // tile)
        first_tile = torch.cumsum(tiles_per_expert, 0) - tiles_per_expert
        row_in_expert = torch.arange(n * k) - (torch.cumsum(counts, 0) - counts)[expert_of_slot]
        dest = (first_tile[expert_of_slot] + row_in_expert // tile) * tile + row_in_expert % tile
        tile_expert = torch.repeat_interleave(torch.arange(e), tiles_per_expert)  # [tiles]
        num_tiles = tile_expert.shape[0]
        xt = x.new_zeros(num_tiles * tile, h).index_copy(0, dest, x[token_of_slot]).view(num_tiles, tile, h)
        hidden = F.silu(torch.bmm(xt, self.w_gate[tile_expert])) * torch.bmm(xt, self.w_up[tile_expert])
        ys = torch.bmm(hidden, self.w_down[tile_expert]).view(num_tiles * tile, h)[dest]
        return torch.zeros_like(x).index_add(0, token_of_slot, ys * probs.reshape(-1)[order, None])


class MoE(nn.Module):
    def __init__(self, cfg: PolicyConfig, layer: int):
        super().__init__()
        self.num_experts = cfg.num_experts
        self.router = Router(cfg, layer)
        self.experts = Experts(cfg)

    def forward(self, x, token_mask):
        """x [B, T, H], token_mask bool [B, T] -> (y [B, T, H], load-balancing loss, a scalar).

        The loss is Switch Transformer's E * sum_e f_e * P_e (f_e: share of token-slots sent to e,
        P_e: mean router probability of e); it is 1.0 when routing is uniform.
        """
        tokens = x[token_mask]
        y = torch.zeros_like(x)
        if tokens.shape[0] == 0:
            return y, x.new_zeros(())
        probs, ids, scores = self.router(tokens)
        y[token_mask] = self.experts(tokens, probs, ids)
        share = torch.bincount(ids.reshape(-1), minlength=self.num_experts).to(x.dtype) / ids.numel()
        return y, self.num_experts * (share * scores.mean(dim=0)).sum()


class Block(nn.Module):
    def __init__(self, cfg: PolicyConfig, layer: int):
        super().__init__()
        self.norm_attn = nn.RMSNorm(cfg.hidden)
        self.attn = Attention(cfg)
        self.norm_moe = nn.RMSNorm(cfg.hidden)
        self.moe = MoE(cfg, layer)

    def forward(self, x, token_mask, attn_mask, cache=None):
        a, cache = self.attn(self.norm_attn(x), attn_mask, cache)
        x = x + a
        m, aux = self.moe(self.norm_moe(x), token_mask)
        return x + m, aux, cache


class MoEPolicy(nn.Module):
    """Token and position embeddings, `num_layers` MoE blocks, a final norm and an untied LM head."""

    def __init__(self, cfg: PolicyConfig, generator: torch.Generator | None = None):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.pos_embed = nn.Embedding(cfg.max_seq_len, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = nn.RMSNorm(cfg.hidden)
        self.register_buffer("_pad_column", torch.arange(cfg.vocab_size) == PAD_ID, persistent=False)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        self.reset_parameters(generator)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """GPT-2 style: N(0, 0.02), residual-output projections scaled by 1/sqrt(2 x layers).

        With a generator the weights depend on it alone, not on torch's global random state.
        """
        std, out_std = 0.02, 0.02 / math.sqrt(2 * self.cfg.num_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "norm" in name:
                    continue
                scale = out_std if name.endswith(("attn.out.weight", "w_down")) else std
                p.copy_(torch.randn(p.shape, generator=generator) * scale)

    @property
    def replays(self) -> list[RouterReplay]:
        """One RouterReplay per MoE layer, in layer order."""
        return [b.moe.router.replay for b in self.blocks]

    def forward(self, tokens, positions, token_mask, attn_mask, caches=None):
        """One pass over new tokens.

        tokens, positions int64 [B, T]; token_mask bool [B, T] (which tokens are real, hence routed);
        attn_mask bool [B, 1, T, T_past + T]; caches: per-layer (k, v) of earlier positions, or None.
        Returns (logits [B, T, V], mean load-balancing loss over layers, new caches).
        """
        x = self.embed(tokens) + self.pos_embed(positions)
        aux_total = x.new_zeros(())
        new_caches = []
        for i, block in enumerate(self.blocks):
            x, aux, cache = block(x, token_mask, attn_mask, None if caches is None else caches[i])
            aux_total = aux_total + aux
            new_caches.append(cache)
        logits = self.lm_head(self.norm(x))
        # PAD is never a response token: keep it out of sampling and of every log-probability.
        logits = logits.masked_fill(self._pad_column, -1e9)
        return logits, aux_total / len(self.blocks), new_caches

    def forward_train(self, tokens, token_mask):
        """Full sequences, right-padded: tokens int64 [B, T], token_mask bool [B, T]. -> (logits, aux)."""
        b, t = tokens.shape
        positions = torch.arange(t).expand(b, t)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        logits, aux, _ = self(tokens, positions, token_mask, causal.expand(b, 1, t, t))
        return logits, aux
