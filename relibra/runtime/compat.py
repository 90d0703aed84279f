"""Every patch megatron-core needs on a CPU-only torch, in one place.

megatron-core (0.15 and 0.16) assumes CUDA in a few spots that the kit's CPU runtime reaches:
1. `torch.cuda.current_device()` places router weights, buffers and all-to-all outputs; on CPU it
   must answer "cpu".
2. The alltoall dispatcher copies split sizes on a side `torch.cuda.Stream`, waits on it and
   records an `Event`; on CPU those become no-ops (everything is already on the host).
3. The dispatcher then hands the split sizes to `torch.distributed.all_to_all_single` as CPU
   tensors (on GPU they are numpy arrays); gloo rejects tensors there, so they become lists of ints.
4. `moe_utils.te_general_gemm` must be None when Transformer Engine is absent; 0.16 leaves the name
   unbound when its import fails, so the router's GEMM raises NameError. This one is applied on every
   device, CUDA included.
5. Distributed checkpointing (`dist_checkpointing.save`, strategies/filesystem_async.py) calls
   `torch.cuda.synchronize()` before it writes; on the host there is nothing to wait for.
6. megatron's optimizers, grad buffers and grad-norm helpers make scalars with `device='cuda'`
   (optimizer.py, distrib_optimizer.py, clip_grads.py, param_and_grad_buffer.py, utils.py): in
   those modules `torch` becomes a view of torch whose tensor / zeros / empty put 'cuda' on the host;
   the pipeline schedules (pipeline_parallel/schedules.py: the token count of a step) alike. Their
   point-to-point shape exchange places its tensors with torch.cuda.current_device() (patch 1).
7. Float16OptimizerWithFloat16Params and DistributedOptimizer sort parameters by `param.type()`
   ('torch.cuda.FloatTensor', 'torch.cuda.BFloat16Tensor') and the gradient clip asserts
   `grad.type()`: a host tensor's `type()` (no arguments) answers with the CUDA name; `type(dtype)`
   casts as before.
The CUDA RNG tracker is not patched: the kit initializes expert weights itself and uses no dropout
or random router logits, so megatron's RNG tracker is never forked.

`apply()` is idempotent. On every device it first checks megatron-core (`check_megatron_version`):
a release is accepted by its release line (SUPPORTED_LINES: 0.15.x and 0.16.x), a development or
pre-release build (0.16.0rc0.devN, the ones slime and verl ship) by its API (`missing_api`: the calls
the kit makes must exist), and anything else is refused with one error. With CUDA available only
patch 4 is applied (the rest then runs on NCCL); on the host the patches below are applied.

Code paths that differ between releases, each named with the release that needs it:
  0.16  `routing_takes_padding_mask`: TopKRouter.routing(logits, padding_mask) (0.15: routing(logits)).
  0.16  `router_in_moe_submodules`: the MoE spec names its router (0.15: MoELayer builds TopKRouter by
        name; `build_routers_from_submodules` makes that name build the router the spec names).
  0.16  `native_router_replay`: TopKRouter builds a RouterReplay when the config sets
        moe_enable_routing_replay, and topk_routing_with_score_function asks it for the top-k
        (router_replay=...). 0.15 has neither: `given_topk` then hands given ids to the router
        through the top-k call of topk_routing_with_score_function (`_GivenTopkTorch`).
  0.16  `moe_layer_regions`: MoELayer.route and .preprocess (0.15: one router_and_preprocess).
  0.16  `sharded_tensors_for_checkpoint`: make_sharded_tensors_for_checkpoint takes tp_group and
        dp_cp_group (0.15 reads parallel_state's); with `dp_cp_metadata`, the sharded-state metadata
        carries the latter on 0.16 only.
  0.15  `expert_tp_checkpoint_view`: the experts' sharded state is TP-sharded by parallel_state's TP group,
        which 0.15's own expert classes swap for the expert-TP group while they make it
        (experts.expert_dist_ckpt_decorator); the kit's logical views take the same swap. 0.16 removed it:
        its expert layers hand their expert-TP group to the sharding calls.
  0.16  `forward_backward_func`: get_forward_backward_func takes the pipeline size (0.15 reads
        parallel_state's).
  0.16  `provide_global_tp_group`: a layer given no TP group passes None through (0.15 asserts
        parallel_state's; it then gets the model's).
  0.19  `legacy_grouped_mlp`: GroupedMLP was removed (None there; TEGroupedMLP remains).
  0.19  `moe_spec_parts`: layer specs may hold functools.partial(MoELayer, submodules=...) instead
        of a ModuleSpec(module=MoELayer).
  0.19  the router is built with extra keyword arguments (is_mtp_layer), which PlacementRouter passes
        on, and the dispatcher passes use_nccl_stream to all_to_all, which patch 3 passes on.
  0.19 also needs Python 3.12 to install and triton at import (moe/ops/paged_stash.py), so it is not
  installed here; its release line is refused until it is tested (docs/integration.md).

Tested: 0.15.3 (a CI step of its own: ./reproduce.sh test-mcore 0.15), 0.16.0 and 0.16.1 (files the kit
reaches identical), and the development build 0.16.0rc0.dev132713 from PyPI (runtime and integration
tests), whose API is 0.15's on every probe here (no RouterReplay, no router in the MoE spec).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys

import torch
from megatron.core import package_info
from packaging.version import InvalidVersion, Version

from relibra.errors import ConfigError

# The megatron-core releases the kit's tests ran against (pyproject.toml declares a range holding them).
TESTED_MEGATRON_CORE = ("0.15.3", "0.16.0", "0.16.1", "0.16.0rc0.dev132713")
# Release lines accepted by version (final releases); development builds are judged by their API.
SUPPORTED_LINES = ((0, 15), (0, 16))

_applied = False


class _HostStream:
    """Stands in for torch.cuda.Stream / Event on the host: every wait and sync is already done."""

    def wait_stream(self, other) -> None:
        return None

    def record_event(self, event=None) -> "_HostStream":
        return self

    def synchronize(self) -> None:
        return None

    def wait_event(self, event) -> None:
        return None

    def wait(self, stream=None) -> None:  # Event.wait (HybridDeviceOptimizer's copy-back)
        return None

    def query(self) -> bool:
        return True


_HOST_STREAM = _HostStream()


def _split_sizes_as_list(sizes):
    """gloo's all_to_all_single takes split sizes as a list of ints (or None)."""
    if sizes is None:
        return None
    if torch.is_tensor(sizes):
        return [int(x) for x in sizes.tolist()]
    return [int(x) for x in sizes]


def _host_device(device):
    if device == "cuda" or (isinstance(device, torch.device) and device.type == "cuda"):
        return "cpu"
    return device


class _HostTorch:
    """torch, with tensor factories that put device 'cuda' on the host (patch 5)."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def tensor(*args, device=None, **kwargs):
        return torch.tensor(*args, device=_host_device(device), **kwargs)

    @staticmethod
    def zeros(*args, device=None, **kwargs):
        return torch.zeros(*args, device=_host_device(device), **kwargs)

    @staticmethod
    def empty(*args, device=None, **kwargs):
        return torch.empty(*args, device=_host_device(device), **kwargs)


_tensor_type = torch.Tensor.type


def _cuda_type_name(self, dtype=None, non_blocking=False, **kwargs):
    """Patch 6: a host tensor's type name as megatron's optimizers expect it on a GPU."""
    if dtype is None and not kwargs and self.device.type == "cpu":
        return _tensor_type(self).replace("torch.", "torch.cuda.", 1)
    return _tensor_type(self, dtype, non_blocking, **kwargs)


def megatron_version() -> str:
    return package_info.__version__


def cuda_absent() -> bool:
    return not torch.cuda.is_available()


def missing_api() -> list[str]:
    """What the kit calls in megatron-core and this installation lacks (empty when all is there).

    The probes name the contract, not a version: TopKRouter.routing and the module-level
    topk_routing_with_score_function it calls (the router subclass and the given-ids path), SequentialMLP
    and MoELayer (the spec wrap), the dispatcher's all_to_all (the CPU patch)."""
    missing = []
    try:
        from megatron.core.transformer.moe import moe_utils, router
    except ImportError as exc:  # e.g. 0.19 without triton
        return [f"megatron.core.transformer.moe.router ({exc})"]
    if not callable(getattr(getattr(router, "TopKRouter", None), "routing", None)):
        missing.append("TopKRouter.routing")
    if not callable(getattr(moe_utils, "topk_routing_with_score_function", None)):
        missing.append("moe_utils.topk_routing_with_score_function")
    elif not native_router_replay() and getattr(router, "topk_routing_with_score_function", None) is None:
        missing.append("router.topk_routing_with_score_function (the top-k call given ids go through)")
    for module, name in (("megatron.core.transformer.moe.experts", "SequentialMLP"),
                         ("megatron.core.transformer.moe.moe_layer", "MoELayer"),
                         ("megatron.core.transformer.moe.token_dispatcher", "all_to_all")):
        try:
            if getattr(__import__(module, fromlist=[name]), name, None) is None:
                missing.append(f"{module}.{name}")
        except ImportError as exc:
            missing.append(f"{module} ({exc})")
    return missing


def check_megatron_version() -> str:
    """megatron-core's version, or ConfigError when the kit does not support it.

    A final release must be of a supported line (SUPPORTED_LINES); a development or pre-release build
    (0.16.0rc0.devN) must have the API the kit calls (missing_api), whatever its version string says."""
    version = megatron_version()
    lines = " and ".join(f"{a}.{b}.x" for a, b in SUPPORTED_LINES)
    try:
        parsed = Version(version)
    except InvalidVersion:
        parsed = None
    if parsed is not None and not (parsed.is_prerelease or parsed.is_devrelease):
        if (parsed.major, parsed.minor) not in SUPPORTED_LINES:
            raise ConfigError(f"ReLibra's runtime supports megatron-core {lines} releases (tested: "
                              f"{', '.join(TESTED_MEGATRON_CORE)}); found {version}: releases from 0.17 need Python "
                              "3.12 and are untested (docs/integration.md lists what 0.19 changes)")
        return version
    missing = missing_api()
    if missing:
        raise ConfigError(f"megatron-core {version} (a development build, judged by its API) lacks what ReLibra's "
                          f"runtime calls: {'; '.join(missing)}")
    return version


# ---- code paths that differ between releases --------------------------------------------------------
@functools.cache
def routing_takes_padding_mask() -> bool:
    """0.16: TopKRouter.routing(logits, padding_mask=None); 0.15: routing(logits)."""
    from megatron.core.transformer.moe.router import TopKRouter

    return "padding_mask" in inspect.signature(TopKRouter.routing).parameters


@functools.cache
def native_router_replay() -> bool:
    """0.16: topk_routing_with_score_function(..., router_replay=...) asks the router's RouterReplay
    (megatron/core/transformer/moe/router_replay.py) for the top-k; 0.15 has no replay hook at all."""
    from megatron.core.transformer.moe import moe_utils

    return "router_replay" in inspect.signature(moe_utils.topk_routing_with_score_function).parameters


def routing_replay_option() -> dict:
    """The config option that gives every TopKRouter megatron-core's RouterReplay: {moe_enable_routing_replay:
    True} from 0.16, {} on 0.15 (no such option; a stack's patch such as verl's brings its own)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    fields = {f.name for f in __import__("dataclasses").fields(TransformerConfig)}
    return {"moe_enable_routing_replay": True} if "moe_enable_routing_replay" in fields else {}


@functools.cache
def router_in_moe_submodules() -> bool:
    """0.16: MoESubmodules has a `router` the MoELayer builds; 0.15: MoELayer.__init__ builds
    `TopKRouter(config=..., pg_collection=...)` by its module-level name (build_routers_from_submodules)."""
    import dataclasses

    from megatron.core.transformer.moe.moe_layer import MoESubmodules

    return "router" in {f.name for f in dataclasses.fields(MoESubmodules)}


def build_routers_from_submodules() -> None:
    """0.15 (no router in MoESubmodules): re-bind moe_layer's module-level name TopKRouter to a function
    that builds, for the MoELayer calling it, the router its submodules name in `relibra_router`
    (relibra.runtime.spec.wrap_moe_spec sets it), and megatron-core's TopKRouter for any other layer.
    The layer stays megatron's own MoELayer class: 0.15's TransformerLayer hands its process groups only to
    that exact class. Idempotent."""
    from megatron.core.transformer.moe import moe_layer

    if getattr(moe_layer.TopKRouter, "builds_from_submodules", False):
        return
    stock = moe_layer.TopKRouter

    def router_of_calling_layer(*args, **kwargs):
        caller = sys._getframe(1).f_locals.get("self")  # the MoELayer whose __init__ builds its router
        factory = getattr(getattr(caller, "submodules", None), "relibra_router", None)
        if not isinstance(caller, moe_layer.MoELayer) or factory is None:
            return stock(*args, **kwargs)
        return factory(*args, **kwargs)

    router_of_calling_layer.builds_from_submodules = True
    moe_layer.TopKRouter = router_of_calling_layer


def moe_layer_regions() -> list[tuple[str, str, dict]]:
    """The MoELayer methods the runtime times (relibra.runtime.engine.instrument): (method, region,
    timed_region keywords). 0.16: route, preprocess (its count all-gather), dispatch,
    routed_experts_compute, combine. 0.15 has no route / preprocess: router_and_preprocess runs both and
    is timed as the router (its permute and count all-gather included; the permute region stays empty)."""
    from megatron.core.transformer.moe.moe_layer import MoELayer

    tail = [("dispatch", "dispatch", {"collective": ("forward", "backward")}),
            ("routed_experts_compute", "expert_compute", {"count_tokens": True}),
            ("combine", "combine", {"collective": ("forward", "backward")})]
    if hasattr(MoELayer, "route") and hasattr(MoELayer, "preprocess"):
        return [("route", "router", {}), ("preprocess", "permute", {"collective": ("forward",)})] + tail
    return [("router_and_preprocess", "router", {"collective": ("forward",)})] + tail


def provide_global_tp_group(pg_collection) -> None:
    """0.15 (and the 0.16.0rc0 development builds on PyPI): attention's output projection
    (tensor_parallel/layers.py, linear_with_grad_accumulation_and_async_allreduce) falls back to
    parallel_state's TP group, and utils.get_tensor_model_parallel_group_if_none asserts it exists; a model
    built from explicit process groups (the runtime's) has none there. 0.16 passes None through. Probed by
    that call; where it asserts, parallel_state's TP group becomes pg_collection.tp."""
    import warnings

    from megatron.core import parallel_state, utils

    if parallel_state._TENSOR_MODEL_PARALLEL_GROUP is not None:
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            utils.get_tensor_model_parallel_group_if_none(None)
    except AssertionError:
        parallel_state._TENSOR_MODEL_PARALLEL_GROUP = pg_collection.tp


def dp_cp_metadata(metadata: dict | None) -> dict | None:
    """The sharded-state metadata with its data x context-parallel group, as 0.16's MLP.sharded_state_dict
    wants it (megatron's ensure_metadata_has_dp_cp_group); 0.15's sharded-state API has no such group, so
    there the metadata passes as it is."""
    try:
        from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group
    except ImportError:  # 0.15
        return metadata
    return ensure_metadata_has_dp_cp_group(metadata)


def sharded_tensors_for_checkpoint(tensors: dict, prefix: str, axis_map: dict, offsets: tuple, tp_group,
                                   metadata: dict | None) -> dict:
    """megatron's make_sharded_tensors_for_checkpoint of `tensors` under `prefix`, TP-split along
    `axis_map`. 0.16 takes the TP and data x context-parallel groups as arguments (the latter from
    the metadata, dp_cp_metadata); 0.15 has neither argument and reads both groups from
    parallel_state, which the runtime's megatron_grid (initialize_model_parallel) sets (for experts
    the TP group there is the expert-TP one: expert_tp_checkpoint_view)."""
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    if "dp_cp_group" in inspect.signature(make_sharded_tensors_for_checkpoint).parameters:
        return make_sharded_tensors_for_checkpoint(tensors, prefix, axis_map, offsets, tp_group=tp_group,
                                                   dp_cp_group=(metadata or {}).get("dp_cp_group"))
    return make_sharded_tensors_for_checkpoint(tensors, prefix, axis_map, offsets)


def expert_tp_checkpoint_view(sharded_state_dict):
    """An experts module's sharded_state_dict method, made under the expert-TP group.

    0.15 (and the 0.16.0rc0 development builds): make_tp_sharded_tensor_for_checkpoint shards along
    parallel_state's TP rank and size, which are the dense layers'; SequentialMLP and TEGroupedMLP wrap
    their sharded_state_dict in experts.expert_dist_ckpt_decorator, which puts the expert-TP rank, size
    and group there for the call. The method gets that same decorator, so with expert TP 1 under dense
    TP 2 an expert weight stays whole rather than being labelled a TP half. 0.16 has no such decorator
    (the expert-TP group is passed as tp_group): the method as it is."""
    from megatron.core.transformer.moe import experts

    swap_in_expert_tp = getattr(experts, "expert_dist_ckpt_decorator", None)
    return sharded_state_dict if swap_in_expert_tp is None else swap_in_expert_tp(sharded_state_dict)


def forward_backward_func(pp: int):
    """megatron's pipeline schedule for `pp` stages (no virtual stages): 0.16's
    get_forward_backward_func(pp_size=...) takes the sizes; 0.15's takes none and reads parallel_state's."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    if "pp_size" in inspect.signature(get_forward_backward_func).parameters:
        return get_forward_backward_func(pp_size=pp)
    return get_forward_backward_func()


def legacy_grouped_mlp():
    """The legacy GroupedMLP class (one weight for all local experts), or None where a release removed
    it (0.19: only TEGroupedMLP remains)."""
    from megatron.core.transformer.moe import experts

    return getattr(experts, "GroupedMLP", None)


def moe_spec_parts(node):
    """(MoELayer subclass, its submodules) when `node` is a MoE layer spec, else None. Specs up to 0.16
    hold ModuleSpec(module=MoELayer, submodules=...); 0.19's hold functools.partial(MoELayer,
    submodules=..., ...)."""
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.spec_utils import ModuleSpec

    if isinstance(node, ModuleSpec) and isinstance(node.module, type) and issubclass(node.module, MoELayer):
        return node.module, node.submodules
    if isinstance(node, functools.partial) and isinstance(node.func, type) and issubclass(node.func, MoELayer):
        return node.func, node.keywords.get("submodules")
    return None


class _GivenTopkTorch:
    """torch, inside one topk_routing_with_score_function call (0.15), with a topk that answers the
    router's top-k selection ([T, E] scores, k = K) with given ids [T, K]; every other call is torch's."""

    def __init__(self, ids: torch.Tensor, check):
        self.ids = ids
        self.check = check  # (scores, topk) -> ids, raising on a shape or range mismatch

    def __getattr__(self, name):
        return getattr(torch, name)

    def topk(self, input, k, dim=-1, *args, **kwargs):
        if input.dim() == 2 and dim in (1, -1) and k == self.ids.shape[-1] and input.shape[0] == self.ids.shape[0]:
            ids = self.check(input, k)
            return input.gather(1, ids), ids
        return torch.topk(input, k, dim, *args, **kwargs)


@contextlib.contextmanager
def given_topk(router, replay_object, ids: torch.Tensor, check):
    """Inside the block, `router`'s routing takes its top-k from `ids` [T, K].

    Every release: router.router_replay is `replay_object`, which megatron-core 0.16's
    topk_routing_with_score_function asks (get_replay_topk) and a stack's routing patch reads (verl's
    router_replay_patch: router_replay_action, target_topk_idx). 0.15 (no router_replay in
    topk_routing_with_score_function): its top-k call is answered with the ids as well."""
    installed = getattr(router, "router_replay", None)
    router.router_replay = replay_object
    patched = None
    if not native_router_replay():
        from megatron.core.transformer.moe import moe_utils
        from megatron.core.transformer.moe import router as router_module

        original = router_module.topk_routing_with_score_function

        def with_given_topk(*args, **kwargs):
            real = moe_utils.torch
            moe_utils.torch = _GivenTopkTorch(ids, check)
            try:
                return original(*args, **kwargs)
            finally:
                moe_utils.torch = real

        router_module.topk_routing_with_score_function = with_given_topk
        patched = (router_module, original)
    try:
        yield
    finally:
        router.router_replay = installed
        if patched is not None:
            patched[0].topk_routing_with_score_function = patched[1]


def apply() -> bool:
    """Check megatron-core's version (every device), then patch torch.cuda and megatron-core for a
    CPU-only run. Returns True when the CPU patches are active, False on a CUDA machine."""
    global _applied
    if _applied:
        return True
    check_megatron_version()
    _router_gemm_without_te()
    if not cuda_absent():
        return False

    # (1) and (2): CUDA device and stream calls become host no-ops.
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.Stream = lambda *args, **kwargs: _HostStream()
    torch.cuda.Event = lambda *args, **kwargs: _HostStream()
    torch.cuda.current_stream = lambda *args, **kwargs: _HOST_STREAM
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()
    # (5): device syncs (distributed checkpointing) have nothing to wait for.
    torch.cuda.synchronize = lambda *args, **kwargs: None

    # (3): the dispatcher's all-to-all gets split sizes as lists. megatron-core's private modules are
    # imported here, after the version check, so another release fails with its one clear error.
    from megatron.core.tensor_parallel import mappings
    from megatron.core.transformer.moe import token_dispatcher

    original_all_to_all = mappings.all_to_all

    def all_to_all_with_list_splits(group, input_, output_split_sizes_=None, input_split_sizes=None, **kwargs):
        # 0.19 passes use_nccl_stream (and may pass more): handed on as given.
        return original_all_to_all(group, input_, _split_sizes_as_list(output_split_sizes_),
                                   _split_sizes_as_list(input_split_sizes), **kwargs)

    token_dispatcher.all_to_all = all_to_all_with_list_splits

    # (6) and (7): megatron's DDP and optimizers on the host.
    from megatron.core import utils as megatron_utils
    from megatron.core.distributed import param_and_grad_buffer
    from megatron.core.optimizer import clip_grads, distrib_optimizer, optimizer
    from megatron.core.pipeline_parallel import schedules

    for module in (optimizer, distrib_optimizer, clip_grads, param_and_grad_buffer, megatron_utils, schedules):
        module.torch = _HostTorch()
    torch.Tensor.type = _cuda_type_name
    _applied = True
    return True


def _router_gemm_without_te() -> None:
    """(4) on every device: without Transformer Engine, megatron-core 0.16's router GEMM reads a
    name `te_general_gemm` that its failed import never bound (seen on an H200: NameError in
    moe_utils.router_gating_linear); None selects its torch path."""
    from megatron.core.transformer.moe import moe_utils

    if not getattr(moe_utils, "HAVE_TE", False) or not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
