"""Where an optimizer keeps the master copy and the state of one model parameter, for migration.

A migrated expert carries its weights, the optimizer's master copy of them and the optimizer state
(Adam's exp_avg, exp_avg_sq and step). Where these live depends on the optimizer:
  torch optimizer (AdamW, Adam)           the parameter is its own master; state in optimizer.state[p]
  megatron FP32Optimizer                  the same, on the wrapped torch optimizer
  megatron Float16OptimizerWithFloat16Params
                                          fp32 master copy of each bf16 / fp16 parameter
                                          (fp32_from_float16_groups), state keyed by the master
  megatron DistributedOptimizer           each data-parallel rank holds a contiguous shard of every
                                          parameter's fp32 master and state (its range of the grad
                                          buffer); a parameter may be split between ranks
  DistributedOptimizer with CPU offload   the same shards, stepped by megatron's HybridDeviceOptimizer
  (optimizer_cpu_offload)                 (optimizer/cpu_offloading/hybrid_optimizer.py): an offloaded
                                          shard has a host copy that the host Adam steps; its state is
                                          keyed by the copy and `state["master_param"]` is the copy,
                                          which is copied back onto the shard after each step. The copy
                                          is the master read; both copy and shard are written.
A megatron ChainedOptimizer (what get_megatron_optimizer returns) is searched sub-optimizer by
sub-optimizer (megatron/core/optimizer/optimizer.py, distrib_optimizer.py of megatron-core 0.16.1).
Refused, with one error naming the setting: megatron's precision-aware optimizer
(use_precision_aware_optimizer: Transformer Engine's FusedAdam keeps the master weights, or only
their low bits with store_param_remainders, and the moments in its own dtypes and scales).

`OptimizerState.gather` returns, for each parameter, the whole master and state tensors (flat); on a
sharded optimizer the ranks of the data-parallel group that shares the shards assemble them with one
all-reduce (every rank writes its own range into zeros). `OptimizerState.write` puts whole tensors
back, each rank keeping only its own range. The layout of every home slot is the same on every EP
rank, so whole tensors move between slots and ranks without looking at shards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from relibra.errors import ConfigError

# The state entries a migration moves (Adam / AdamW); any other tensor entry is refused by name.
MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass
class _Piece:
    """Elements [start, end) of a parameter's flattened master and state live in `master` (1-D or the
    parameter's shape), whose state is inner.state[master]; `mirrors` hold copies of the master that
    are written with it (a host-offloaded shard's device shard)."""

    master: torch.Tensor
    inner: torch.optim.Optimizer
    start: int
    end: int
    mirrors: tuple = ()


def _hybrid_piece(hybrid, shard: torch.Tensor, start: int, end: int) -> _Piece:
    """The piece of a DistributedOptimizer shard stepped by megatron's HybridDeviceOptimizer: the master
    is the sub-optimizer's own copy (host copy or fp32 copy; the shard itself when neither), the state
    that sub-optimizer's state of the copy."""
    inner_param = hybrid.param_to_inner_param.get(shard, shard)
    owner = next((sub for sub in hybrid.sub_optimizers
                  if any(p is inner_param for g in sub.param_groups for p in g["params"])), None)
    if owner is None:
        raise ConfigError("migration cannot find the sub-optimizer of an expert shard in megatron's "
                          "HybridDeviceOptimizer (optimizer CPU offload)")
    return _Piece(inner_param, owner, start, end, () if inner_param is shard else (shard,))


def _sub_optimizers(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", None) or [optimizer])


def _pieces(optimizer) -> tuple[dict[int, list[_Piece]], bool]:
    """{id(model param): its pieces on this rank}, and whether any sub-optimizer shards over ranks."""
    out: dict[int, list[_Piece]] = {}
    sharded = False
    for sub in _sub_optimizers(optimizer):
        name = type(sub).__name__
        if isinstance(sub, torch.optim.Optimizer):  # a plain torch optimizer
            for group in sub.param_groups:
                for p in group["params"]:
                    out[id(p)] = [_Piece(p, sub, 0, p.numel())]
        elif name == "DistributedOptimizer":
            sharded = True
            check_optimizer_config(getattr(sub, "config", None))
            hybrid = sub.optimizer if type(sub.optimizer).__name__ == "HybridDeviceOptimizer" else None
            fp32 = {id(m): s for mg, sg in zip(sub.model_fp32_groups, sub.shard_fp32_groups) for m, s in zip(mg, sg)}
            for p, (gbuf, dtype, bucket) in sub.model_param_gbuf_map.items():
                rng = sub.gbuf_ranges[gbuf][dtype][bucket]["param_map"][p]["param"]
                master = fp32.get(id(p)) if id(p) in fp32 else getattr(p, "main_param", None)
                if master is None or rng.end <= rng.start:
                    continue
                piece = (_hybrid_piece(hybrid, master, rng.start, rng.end) if hybrid is not None
                         else _Piece(master, sub.optimizer, rng.start, rng.end))
                out.setdefault(id(p), []).append(piece)
        elif name == "Float16OptimizerWithFloat16Params":
            for mg, fg in zip(sub.float16_groups, sub.fp32_from_float16_groups):
                for p, master in zip(mg, fg):
                    out[id(p)] = [_Piece(master, sub.optimizer, 0, p.numel())]
            for group in sub.fp32_from_fp32_groups:
                for p in group:
                    out[id(p)] = [_Piece(p, sub.optimizer, 0, p.numel())]
        elif name == "FP32Optimizer":
            for group in sub.optimizer.param_groups:
                for p in group["params"]:
                    out[id(p)] = [_Piece(p, sub.optimizer, 0, p.numel())]
        else:
            raise ConfigError(f"migration cannot find the master copy and state of expert parameters in a {name}; "
                              "supported: torch optimizers, megatron FP32Optimizer, "
                              "Float16OptimizerWithFloat16Params, DistributedOptimizer and a ChainedOptimizer of them")
    return out, sharded


def check_optimizer_config(config) -> None:
    """Refuse (ConfigError) a megatron OptimizerConfig whose expert state a migration cannot move:
    use_precision_aware_optimizer=True."""
    if getattr(config, "use_precision_aware_optimizer", False):
        raise ConfigError("migration cannot move expert state held by megatron's precision-aware optimizer "
                          "(use_precision_aware_optimizer=True: Transformer Engine's FusedAdam keeps the "
                          "master weights, or their remainder bits, and the moments in its own dtypes and "
                          "scales); train with use_precision_aware_optimizer=False")


class OptimizerState:
    """Master copies and Adam state of model parameters, whole, wherever `optimizer` keeps them.

    dp_group: the ranks that share a sharded optimizer's shards of these parameters (megatron's
    expert data-parallel group, pg_collection.expt_dp); needed only for a DistributedOptimizer.
    """

    def __init__(self, optimizer, dp_group=None):
        if optimizer is None:
            raise ConfigError("no optimizer: give the hook its optimizer (hook.optimizer = ...) before the first "
                              "migration, so expert state moves with the weights")
        self.pieces, self.sharded = _pieces(optimizer)
        self.dp_group = dp_group

    def _of(self, p: torch.Tensor) -> list[_Piece]:
        try:
            return self.pieces[id(p)]
        except KeyError:
            if self.sharded:
                return []  # this rank owns no shard of p
            raise ConfigError(f"an expert parameter of shape {tuple(p.shape)} is not in the optimizer; give the "
                              "optimizer every home expert parameter") from None

    @staticmethod
    def _state(piece: _Piece) -> dict:
        state = piece.inner.state.get(piece.master, {})
        extra = [k for k, v in state.items() if torch.is_tensor(v) and k not in MOMENTS and k != "step"
                 and not (k == "master_param" and v is piece.master)]  # the offloaded copy's own entry
        if extra:
            raise ConfigError(f"migration moves {', '.join(MOMENTS)} and step; the optimizer also keeps "
                              f"{', '.join(map(str, extra))} (amsgrad or another optimizer?), which it would lose")
        return state

    def gather(self, params: list[torch.Tensor], dtype: torch.dtype) -> list[list[torch.Tensor]]:
        """Per parameter [master, exp_avg, exp_avg_sq, step (shape [1])] whole and flat, in `dtype`.

        Collective over dp_group when the optimizer is sharded: every rank of it must call with the
        same parameters' positions (the same slots) in the same order."""
        out = []
        for p in params:
            n = p.numel()
            parts = [torch.zeros(n, dtype=dtype, device=p.device) for _ in range(1 + len(MOMENTS))]
            step = torch.zeros(1, dtype=dtype, device=p.device)
            for piece in self._of(p):
                state = self._state(piece)
                parts[0][piece.start: piece.end] = piece.master.detach().reshape(-1).to(dtype)
                for i, key in enumerate(MOMENTS):
                    if key in state:
                        parts[1 + i][piece.start: piece.end] = state[key].reshape(-1).to(dtype)
                if "step" in state:
                    step.fill_(float(state["step"]))
            out.append(parts + [step])
        if self.sharded and self.dp_group is not None and self.dp_group.size() > 1 and out:
            tensors = [t for parts in out for t in parts[:-1]]
            buf = torch.cat(tensors)
            dist.all_reduce(buf, group=self.dp_group)  # disjoint ranges: the sum assembles each tensor
            for t, piece in zip(tensors, torch.split(buf, [t.numel() for t in tensors])):
                t.copy_(piece)
            steps = torch.cat([parts[-1] for parts in out])
            dist.all_reduce(steps, op=dist.ReduceOp.MAX, group=self.dp_group)  # owners agree; others hold 0
            for parts, s in zip(out, steps):
                parts[-1].fill_(float(s))
        return out

    def write(self, p: torch.Tensor, tensors: list[torch.Tensor]) -> None:
        """Put [master, exp_avg, exp_avg_sq, step] (whole, flat, from gather) into p's pieces on this rank."""
        master, *moments, step = tensors
        for piece in self._of(p):
            m = piece.master
            for target in (m, *piece.mirrors):
                target.data.view(-1).copy_(master[piece.start: piece.end].to(device=target.device, dtype=target.dtype))
            state = piece.inner.state[piece.master]
            for key, full in zip(MOMENTS, moments):
                state[key] = full[piece.start: piece.end].to(device=m.device, dtype=m.dtype).reshape(m.shape).clone()
            # one step tensor per parameter (AdamW bumps it in place), where the optimizer keeps it: on the host
            # for a non-capturable, non-fused AdamW, beside the master for a fused or capturable one
            group = next((g for g in piece.inner.param_groups if any(q is m for q in g["params"])), {})
            on_device = group.get("fused") or group.get("capturable")
            state["step"] = step.reshape(()).to(device=m.device if on_device else "cpu", dtype=torch.float32).clone()
