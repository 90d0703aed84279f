"""Helpers shared by the test files (tests/ is on sys.path under pytest: `from conftest import ...`)."""

from __future__ import annotations

import contextlib
import os
import socket

import numpy as np

from relibra.cluster import ModelShape, get_model, get_topology
from relibra.plan import StepPlan
from relibra.policies import get_policy
from relibra.trace import RoutingTrace

# `relibra run` measures at once on this shared machine (no wait for a quiet one; the warning still comes).
os.environ.setdefault("RELIBRA_QUIET_WAIT_S", "0")

# Small planner settings so that a test file stays within a few seconds per policy.
FAST = {"relibra": {"iterations": 60, "min_replica_tokens": 1}, "llep": {"min_tokens_per_gemm": 4}}
for _name in ("relibra-reorder", "relibra-replicate", "relibra-lpt", "relibra-split", "relibra-h"):
    FAST[_name] = {"iterations": 60, "min_replica_tokens": 1}


def nodes_of(gpus_per_node: int):
    """The paper cluster's rates on nodes of `gpus_per_node` GPUs (the EP ranks pack into them)."""
    return get_topology("paper").with_changes(gpus_per_node=gpus_per_node)


def make_trace(seed: int, ep: int, experts: int, layers: int = 2, micro_batches: int = 3, steps: int = 2,
               top_k: int = 2, tokens: int = 40, skew: float = 1.2) -> RoutingTrace:
    """Random skewed loads: a Zipf popularity over a shuffled expert order, per micro-batch noise."""
    rng = np.random.default_rng(seed)
    model = ModelShape("test", num_layers=layers, num_experts=experts, top_k=top_k, hidden=8, moe_ffn=8)
    pop = rng.permuted(np.broadcast_to(np.arange(1.0, experts + 1), (steps, micro_batches, layers, ep, experts)),
                       axis=4) ** -skew
    pop *= rng.lognormal(0, 0.5, size=pop.shape)
    pop /= pop.sum(axis=4, keepdims=True)
    loads = rng.multinomial(tokens * top_k, pop).astype(np.int32)
    return RoutingTrace(loads, model, ep, tokens * ep, {"generator": "test", "seed": seed})


def plan_of(name: str, trace: RoutingTrace, step: int, gpus_per_node: int, prev_home=None) -> StepPlan:
    """Policy `name` at FAST settings plans `step` of `trace` on nodes of `gpus_per_node` GPUs."""
    return get_policy(name, **FAST.get(name, {})).plan(trace, step, nodes_of(gpus_per_node), prev_home)


def random_skewed_trace(model: str | ModelShape, ep: int, steps: int = 1, micro_batches: int = 4,
                        tokens_per_rank: int = 256, seed: int = 0, skew: float = 1.0,
                        shift: float = 0.6) -> RoutingTrace:
    """A RoutingTrace with skewed, shifting expert popularity (not a model of any real workload).

    Per (step, layer) a Zipf-like popularity over a random expert order (exponent `skew`); each
    micro-batch multiplies it by log-normal noise of scale `shift`, so hot experts move between
    micro-batches; each src rank draws tokens_per_rank * top_k expert slots from it.
    """
    shape = get_model(model) if isinstance(model, str) else model
    rng = np.random.default_rng(seed)
    e, l, k = shape.num_experts, shape.num_layers, shape.top_k
    ranks = rng.permuted(np.broadcast_to(np.arange(1, e + 1, dtype=np.float64), (steps, l, e)), axis=2)
    base = ranks ** (-skew)  # [S, L, E]
    noise = rng.lognormal(0.0, shift, size=(steps, micro_batches, l, e))
    pop = base[:, None] * noise
    # a per-src tilt so that sources differ (locality for the communication term)
    tilt = rng.lognormal(0.0, 0.3, size=(steps, micro_batches, l, ep, e))
    p = pop[:, :, :, None, :] * tilt
    p /= p.sum(axis=-1, keepdims=True)
    loads = rng.multinomial(tokens_per_rank * k, p).astype(np.int32)
    return RoutingTrace(loads=loads, model=shape, ep=ep, tokens_per_microbatch=tokens_per_rank * ep,
                        provenance={"generator": "tests.conftest.random_skewed_trace", "seed": seed,
                                    "skew": skew, "shift": shift})


@contextlib.contextmanager
def megatron_single_rank():
    """megatron-core's model-parallel state on one gloo rank of this process (compat applied, its own
    process group when none is initialized, megatron's no-op RNG tracker: no CUDA RNG on the host, the
    test models have no dropout); everything restored on exit. megatron is imported here, not at the top,
    so test files that need none of it do not pay for it."""
    import torch.distributed as dist

    from relibra.runtime import compat

    compat.apply()
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mrandom

    owned = not dist.is_initialized()
    if owned:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    saved = mrandom._CUDA_RNG_STATE_TRACKER, mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED
    mrandom.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    try:
        yield
    finally:
        mrandom._CUDA_RNG_STATE_TRACKER, mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = saved
        parallel_state.destroy_model_parallel()
        if owned:
            dist.destroy_process_group()


def megatron_equivalence(world: int, ep: int, setups: list[dict], *worker_args, timeout_s: float = 400) -> dict:
    """relibra.runtime.verify.megatron_equivalence_worker on `world` gloo ranks (worker_args follow the
    setups: preset, steps, ...); asserts every check the worker made passed; its output (checks, diffs)."""
    from relibra.runtime.launch import launch
    from relibra.runtime.verify import megatron_equivalence_worker

    out = launch(megatron_equivalence_worker, world, ep, setups, *worker_args, timeout_s=timeout_s)
    failed = [k for k, v in out["checks"].items() if v is False]
    assert not failed, failed
    return out


def assert_logical_equivalence(diffs: dict, lr: float, steps: int) -> None:
    """Every setup's diffs against static placement: float64 to rounding (loss 1e-12; weights, the logical
    state dict and the checkpoint's expert tensors 1e-10); the others' loss within 1e-5 (float32) or 1e-2
    (bf16), master, dense and logical weights within 2 x lr x steps."""
    for name, d in diffs.items():
        print(name, {k: f"{v:.3g}" for k, v in d.items() if not isinstance(v, list)})
        if name.startswith("float64"):
            assert d["loss"] <= 1e-12 and d["param"] <= 1e-10 and d["dense"] <= 1e-10, (name, d)
            assert d["logical_state_dict"] <= 1e-10 and d["sharded_experts"] <= 1e-10, (name, d)
        else:
            assert d["loss"] <= (1e-5 if name.startswith("float32") else 1e-2), (name, d)
            assert d["master"] <= 2 * lr * steps and d["dense"] <= 2 * lr * steps, (name, d)
            assert d["logical_state_dict"] <= 2 * lr * steps, (name, d)
