"""`eplb` and `eplb+`: DeepSeek's Expert Parallelism Load Balancer, and the policies built on it.

`rebalance_experts` keeps EPLB's public contract (torch tensors in and out) and returns the same
three tensors as deepseek-ai/EPLB's eplb.py for every input that contract admits:

    phy2log, log2phy, logcnt = rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus)

weight: [layers, experts] predicted load per logical expert. num_replicas: physical slots over all
GPUs (experts + redundant ones), a multiple of num_gpus. Output is GPU-major: physical slot p lives
on GPU p // (num_replicas / num_gpus).
  phy2log: int64 [layers, num_replicas] logical expert held by each physical slot.
  log2phy: int64 [layers, experts, max copies over all layers] physical slots of each expert in
      copy-rank order, -1 padded.
  logcnt:  int64 [layers, experts] copies of each expert.

The algorithm, top to bottom (written from EPLB's README and the contract of its eplb.py; see
docs/policies.md):
  hierarchical policy, when num_groups % num_nodes == 0:
    (1) groups of experts/num_groups consecutive experts are packed onto nodes by summed load;
    (2) inside each node, every redundant slot goes, one at a time, to the expert with the largest
        load per copy (the first such expert on ties);
    (3) the node's copies (load = expert load / copies) are packed onto the node's GPUs.
  global policy, otherwise: the same with one group and one node (no group check: num_groups
    need not divide the experts, and num_nodes need not divide num_gpus).
Packing ("balanced packing", every pack taking the same number of items): with one item per pack,
item i goes to pack i; otherwise items in the order torch.sort(descending=True) gives (EPLB's
ordering, including its order among equal loads), each into the lightest pack that still has room
(the lowest such pack on ties). Like EPLB, all arithmetic is float32: the input is cast to
float32, group sums are torch float32 sums, loads per copy are float32 quotients and pack loads
float32 running sums.

The policies (EplbPolicy `eplb`, EplbOraclePolicy `eplb+`) deploy EPLB's placement the way a cluster
would: relabelled onto the previous step's homes so that the fewest experts move
(relibra.policies.relabel), and re-planned every `replan_interval` steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from relibra.cluster import Topology
from relibra.errors import ConfigError
from relibra.plan import PlanInfo, StepPlan
from relibra.policies.base import Policy, check_nonnegative_int, register
from relibra.policies.relabel import apply_gpu_permutation, match_gpus, relabel_home
from relibra.policies.split import pack_replicas, replica_runs
from relibra.trace import RoutingTrace

if TYPE_CHECKING:  # annotations only
    import torch


# ---- EPLB's algorithm ------------------------------------------------------------------------------
def balanced_packing(weight: torch.Tensor, num_packs: int) -> tuple[np.ndarray, np.ndarray]:
    """Pack items into num_packs packs of equal count, heaviest first into the lightest open pack.

    weight: float32 tensor [rows, items], items a multiple of num_packs.
    Returns (pack int64 [rows, items], rank_in_pack int64 [rows, items]). One item per pack: item i
    goes to pack i (no sorting).
    """
    rows, items = weight.shape
    per_pack = items // num_packs
    if per_pack == 1:
        return np.broadcast_to(np.arange(items), (rows, items)).copy(), np.zeros((rows, items), dtype=np.int64)
    order = weight.sort(dim=-1, descending=True).indices.numpy()  # torch's order, ties included
    w = weight.numpy()
    pack = np.zeros((rows, items), dtype=np.int64)
    rank = np.zeros((rows, items), dtype=np.int64)
    pack_load = np.zeros((rows, num_packs), dtype=np.float32)
    pack_items = np.zeros((rows, num_packs), dtype=np.int64)
    row = np.arange(rows)
    for i in range(items):
        item = order[:, i]
        chosen = np.argmin(np.where(pack_items < per_pack, pack_load, np.inf), axis=1)  # first minimum
        pack[row, item] = chosen
        rank[row, item] = pack_items[row, chosen]
        pack_load[row, chosen] += w[row, item]  # float32 running sum
        pack_items[row, chosen] += 1
    return pack, rank


def replicate_experts(weight: torch.Tensor, num_physical: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Give each redundant slot, in turn, to the expert with the largest load per copy.

    weight: float32 tensor [rows, experts]. Slots 0..experts-1 hold every expert once, in order.
    Returns (phy2log int64 [rows, num_physical], copy rank of each slot int64 [rows, num_physical],
    copies int64 [rows, experts]).
    """
    rows, experts = weight.shape
    w = weight.numpy()
    phy2log = np.broadcast_to(np.arange(num_physical), (rows, num_physical)).copy()
    copy_rank = np.zeros((rows, num_physical), dtype=np.int64)
    copies = np.ones((rows, experts), dtype=np.int64)
    row = np.arange(rows)
    for p in range(experts, num_physical):
        hottest = np.argmax(w / copies.astype(np.float32), axis=1)  # float32 quotients; first maximum
        phy2log[:, p] = hottest
        copy_rank[:, p] = copies[row, hottest]
        copies[row, hottest] += 1
    return phy2log, copy_rank, copies


def rebalance_hierarchical(weight: torch.Tensor, num_physical: int, num_groups: int, num_nodes: int,
                           num_gpus: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps (1)-(3) of the module docstring.

    weight: float32 tensor [L, E]. Returns (phy2log int64 [L, P], copy rank int64 [L, P], logcnt
    int64 [L, E]) with P = num_physical slots, GPU-major.
    """
    import torch  # heavy: EPLB's tensors; other policies and `relibra --help` load without it

    layers, experts = weight.shape
    group_size = experts // num_groups
    experts_per_node = experts // num_nodes
    phys_per_node = num_physical // num_nodes
    phys_per_gpu = num_physical // num_gpus

    # (1) groups onto nodes; experts relabelled node-major ("node order": node 0's experts first)
    group_load = weight.reshape(layers, num_groups, group_size).sum(dim=-1)  # float32, torch's sum
    group_node, group_rank = balanced_packing(group_load, num_nodes)
    group_pos = group_node * (num_groups // num_nodes) + group_rank  # [L, groups]
    node_order_of = (group_pos[:, :, None] * group_size + np.arange(group_size)).reshape(layers, experts)
    expert_at = np.argsort(node_order_of, axis=1)  # [L, E] expert at each node-order position

    # (2) redundant slots inside each node
    w = weight.numpy()
    node_weight = np.take_along_axis(w, expert_at, axis=1).reshape(layers * num_nodes, experts_per_node)
    phy_local, phy_rank, local_copies = replicate_experts(torch.from_numpy(node_weight), phys_per_node)

    # (3) the node's copies onto its GPUs
    copy_load = np.take_along_axis(node_weight / local_copies.astype(np.float32), phy_local, axis=1)
    gpu_in_node, rank_on_gpu = balanced_packing(torch.from_numpy(copy_load), num_gpus // num_nodes)
    slot_in_node = gpu_in_node * phys_per_gpu + rank_on_gpu  # [L * nodes, phys_per_node]
    local_at_slot = np.empty_like(phy_local)
    np.put_along_axis(local_at_slot, slot_in_node, phy_local, axis=1)
    rank_at_slot = np.empty_like(phy_rank)
    np.put_along_axis(rank_at_slot, slot_in_node, phy_rank, axis=1)

    node_base = (np.arange(num_nodes) * experts_per_node)[None, :, None]
    node_pos = (local_at_slot.reshape(layers, num_nodes, phys_per_node) + node_base).reshape(layers, num_physical)
    phy2log = np.take_along_axis(expert_at, node_pos, axis=1)
    logcnt = np.take_along_axis(local_copies.reshape(layers, experts), node_order_of, axis=1)
    return phy2log, rank_at_slot.reshape(layers, num_physical), logcnt


def check_rebalance_args(layers_experts: tuple[int, ...], num_replicas: int, num_groups: int, num_nodes: int,
                         num_gpus: int) -> bool:
    """Raise ConfigError for inputs outside EPLB's contract; return True for the hierarchical policy."""
    if len(layers_experts) != 2:
        raise ConfigError(f"weight must be [layers, experts], got shape {tuple(layers_experts)}")
    experts = layers_experts[1]
    for key, value in (("num_groups", num_groups), ("num_nodes", num_nodes), ("num_gpus", num_gpus)):
        if not isinstance(value, (int, np.integer)) or value <= 0:
            raise ConfigError(f"EPLB: {key} must be a positive integer, got {value!r}")
    if num_replicas < experts:
        raise ConfigError(f"EPLB: num_replicas={num_replicas} is fewer than the {experts} experts")
    if num_replicas % num_gpus:
        raise ConfigError(f"EPLB: num_gpus={num_gpus} does not divide num_replicas={num_replicas}")
    hierarchical = num_groups % num_nodes == 0
    if hierarchical:
        if experts % num_groups:
            raise ConfigError(f"EPLB hierarchical policy (num_groups % num_nodes == 0): num_groups={num_groups} "
                              f"does not divide the {experts} experts")
        if num_gpus % num_nodes:
            raise ConfigError(f"EPLB hierarchical policy: num_nodes={num_nodes} does not divide num_gpus={num_gpus}")
    return hierarchical


def rebalance_experts(weight, num_replicas: int, num_groups: int, num_nodes: int,
                      num_gpus: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """EPLB's entry point; see the module docstring for shapes. ConfigError outside its contract."""
    import torch  # heavy: EPLB's tensors; other policies and `relibra --help` load without it

    w = torch.as_tensor(weight).detach().to("cpu", torch.float32).contiguous()
    hierarchical = check_rebalance_args(tuple(w.shape), num_replicas, num_groups, num_nodes, num_gpus)
    if hierarchical:
        phy2log, rank, logcnt = rebalance_hierarchical(w, num_replicas, num_groups, num_nodes, num_gpus)
    else:  # global policy: one group, one node
        phy2log, rank, logcnt = rebalance_hierarchical(w, num_replicas, 1, 1, num_gpus)
    layers, experts = w.shape
    log2phy = np.full((layers, experts, int(logcnt.max())), -1, dtype=np.int64)
    layer = np.broadcast_to(np.arange(layers)[:, None], phy2log.shape)
    log2phy[layer, phy2log, rank] = np.arange(num_replicas)[None, :]
    return torch.from_numpy(phy2log), torch.from_numpy(log2phy), torch.from_numpy(logcnt)


# ---- from EPLB's slots to a StepPlan ---------------------------------------------------------------
def copies_from_phy2log(phy2log: np.ndarray, ep: int, num_experts: int) -> np.ndarray:
    """Which GPUs hold a copy of each expert: bool [layers, experts, ep] (duplicates on one GPU merge)."""
    layers, slots = phy2log.shape
    gpu = np.arange(slots) // (slots // ep)
    held = np.zeros((layers, num_experts, ep), dtype=bool)
    held[np.arange(layers)[:, None], phy2log, gpu[None, :]] = True
    return held


def choose_homes(held: np.ndarray, prev_home: np.ndarray | None = None,
                 reference: np.ndarray | None = None) -> np.ndarray:
    """One home per expert among its copies: int64 [layers, experts].

    held: bool [layers, experts, ep]. Experts with one copy are homed there; then, in expert order,
    each replicated expert is homed on the copy GPU that homes the fewest experts so far (lowest GPU
    on ties), which keeps the optimizer state as evenly spread as the copies allow. With prev_home
    (int [layers, experts], the placement the step starts from), a replicated expert whose previous
    home holds one of its copies stays there first, as long as no GPU of the layer ends up homing more
    experts (optimizer state), or holding more replicas (replica buffer), than the busiest GPU of
    `reference` (int [layers, experts], a home choice for the same copies; default the balancing
    choice); where staying would break that, the layer's stays are capped lower, down to none, and
    last the layer takes `reference` itself.
    """
    balanced = _homes(held, None, None)
    if prev_home is None:
        return balanced
    prev_home = np.asarray(prev_home, dtype=np.int64)
    reference = balanced if reference is None else np.asarray(reference, dtype=np.int64)
    most_homes, most_replicas = homes_and_replicas_max(held, reference)  # [layers] each
    stay_cap = most_homes.copy()
    home = _homes(held, prev_home, stay_cap)
    while True:
        homes_now, replicas_now = homes_and_replicas_max(held, home)
        out = (homes_now > most_homes) | (replicas_now > most_replicas)
        if not out.any():
            return home
        stay_cap[out] -= 1  # at 0 nothing stays (the balancing greedy); below 0, the reference
        retry, give_up = out & (stay_cap >= 0), out & (stay_cap < 0)
        home[give_up] = reference[give_up]
        if retry.any():
            home[retry] = _homes(held[retry], prev_home[retry], stay_cap[retry])


def _homes(held: np.ndarray, prev_home: np.ndarray | None, stay_cap: np.ndarray | None) -> np.ndarray:
    """choose_homes' greedy: int64 [layers, experts]; replicated experts whose prev_home holds a copy
    stay there while that GPU homes fewer than stay_cap [layers] experts."""
    layers, experts, ep = held.shape
    ncopies = held.sum(axis=2)
    home = np.argmax(held, axis=2)  # single-copy experts: their only GPU
    single = ncopies == 1
    homes_on = np.zeros((layers, ep), dtype=np.int64)
    lay = np.broadcast_to(np.arange(layers)[:, None], home.shape)
    np.add.at(homes_on, (lay[single], home[single]), 1)
    row = np.arange(layers)
    placed = single.copy()
    if prev_home is not None:
        can_stay = ~single & np.take_along_axis(held, prev_home[:, :, None], axis=2)[:, :, 0]
        for e in range(experts):
            stay = can_stay[:, e] & (homes_on[row, prev_home[:, e]] < stay_cap)
            home[stay, e] = prev_home[stay, e]
            homes_on[row[stay], prev_home[stay, e]] += 1
            placed[stay, e] = True
    for e in range(experts):
        todo = ~placed[:, e]
        if not todo.any():
            continue
        count = np.where(held[:, e, :], homes_on, np.iinfo(np.int64).max)
        chosen = np.argmin(count, axis=1)
        home[todo, e] = chosen[todo]
        homes_on[row[todo], chosen[todo]] += 1
    return home


def homes_and_replicas_max(held: np.ndarray, home: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The most experts one GPU homes and the most replicas one GPU holds, per layer: (int64 [layers],
    int64 [layers]); held: bool [layers, experts, ep], home: int [layers, experts]."""
    layers, _, ep = held.shape
    homes = np.zeros((layers, ep), dtype=np.int64)
    np.add.at(homes, (np.broadcast_to(np.arange(layers)[:, None], home.shape), home), 1)
    return homes.max(axis=1), (held.sum(axis=1) - homes).max(axis=1)


@dataclass(frozen=True)
class EplbInfo(PlanInfo):
    """The EPLB family's clocks and count: rebalance_seconds / rebalance_cpu_seconds (wall / process-CPU
    seconds of EPLB's rebalance, the copies and homes), copies_per_expert_max (the most copies, home
    included, of one expert)."""

    rebalance_seconds: float = 0.0
    rebalance_cpu_seconds: float = 0.0
    copies_per_expert_max: int = 0

    @property
    def balancing_seconds(self) -> tuple[float, float]:
        return self.rebalance_seconds, self.rebalance_cpu_seconds


def plan_from_copies(policy: str, loads: np.ndarray, held: np.ndarray, home: np.ndarray, gpus_per_node: int,
                     slots_per_gpu: int, replica_scope: str, replica_tokens_fn=None,
                     equal_homes: bool = False) -> StepPlan:
    """A StepPlan whose copies are fixed for the whole step.

    loads: int [M, L, ep, E]; held: bool [L, E, ep] copies (home included); home: [L, E].
    replica_tokens_fn(copy list) -> int [M, n] tokens per replica; default: an even split, the
    remainder tokens to the lowest-GPU copies (the home counts as a copy).
    """
    m, l, ep, e = loads.shape
    is_replica = held.copy()
    is_replica[np.arange(l)[:, None], np.arange(e)[None, :], home] = False
    li, ei, gi = np.nonzero(is_replica)  # fixed for every micro-batch
    expert_tokens = loads.sum(axis=2, dtype=np.int64)  # [M, L, E]
    if replica_tokens_fn is None:
        copies = held.sum(axis=2)  # [L, E]
        rank = np.cumsum(held, axis=2)[li, ei, gi] - 1  # copy number in GPU order, home included
        x = expert_tokens[:, li, ei]  # [M, n]
        c = copies[li, ei][None, :]
        tokens = x // c + (rank[None, :] < x % c)
    else:
        tokens = replica_tokens_fn(li, ei, gi)
    n = len(li)
    mi = np.repeat(np.arange(m), n)
    rexp, rtok = pack_replicas((m, l, ep), mi, np.tile(li, m), np.tile(gi, m), np.tile(ei, m),
                               np.asarray(tokens).reshape(-1))
    rstart = replica_runs(home, rexp, rtok, expert_tokens)
    return StepPlan(policy=policy, loads=loads, home=home, replica_expert=rexp, replica_start=rstart,
                    replica_tokens=rtok, gpus_per_node=gpus_per_node, slots_per_gpu=slots_per_gpu, replica_scope=replica_scope,
                    equal_homes=equal_homes)


def eplb_copies(weight: np.ndarray, ep: int, gpus_per_node: int, redundant_slots_per_gpu: int,
                num_groups: int | None, prev_home: np.ndarray | None = None,
                relabel: bool = True) -> tuple[np.ndarray, np.ndarray, str, int]:
    """Run EPLB on weight [L, E]; return (held [L, E, ep], home [L, E], replica_scope, slots_per_gpu).

    With prev_home (int [L, E]) and relabel, EPLB's GPU labels are permuted per layer to keep the
    most experts at home (relibra.policies.relabel.match_gpus: whole nodes first when EPLB's policy is
    hierarchical, then GPUs inside them), and homes prefer the previous one (choose_homes) without any
    GPU homing more experts or holding more replicas than the busiest under the unrelabelled homes.
    Which experts share a GPU, and the copies per expert, are EPLB's.
    """
    import torch  # heavy: EPLB's tensors; other policies and `relibra --help` load without it

    layers, experts = weight.shape
    num_nodes = ep // gpus_per_node
    groups = experts if num_groups is None else num_groups
    num_replicas = experts + ep * redundant_slots_per_gpu
    phy2log, _, _ = rebalance_experts(torch.from_numpy(np.asarray(weight, dtype=np.float64)), num_replicas,
                                      groups, num_nodes, ep)
    held = copies_from_phy2log(phy2log.numpy(), ep, experts)
    home = choose_homes(held)
    hierarchical = groups % num_nodes == 0
    if prev_home is not None and relabel:
        perm = match_gpus(held, prev_home, gpus_per_node if hierarchical else ep)
        held = apply_gpu_permutation(held, perm)
        # stays bounded by EPLB's own homes, relabelled: no GPU homes or holds more than there
        home = choose_homes(held, prev_home, reference=relabel_home(home, perm))
    return held, home, ("node" if hierarchical else "any"), num_replicas // ep


@register
@dataclass
class EplbPolicy(Policy):
    """EPLB fed a moving average of the previous `window` steps' loads (history-based).

    redundant_slots_per_gpu: extra physical slots per GPU (EPLB's num_replicas = experts + ep * this);
        default 2, the same replica buffer ReLibra gets.
    num_groups: expert groups for the hierarchical policy; None = one group per expert (the models
        here route without groups), which makes the hierarchical policy apply and keeps every copy
        of an expert inside one node. A count not divisible by the node count selects EPLB's global
        policy (copies anywhere).
    relabel: map EPLB's new placement onto the previous step's homes so that the fewest experts move
        (relibra.policies.relabel: a per-layer matching of GPU labels, whole nodes first under the
        hierarchical policy; the balance is EPLB's). False: EPLB's own GPU labels, every home rebuilt.
    replan_interval: k, EPLB re-plans at steps that are multiples of k, from that step's prediction,
        and the placement (copies and homes) stays until the next re-plan; the tokens of each step
        are split over the copies it holds. 1 re-plans every step.
    replan_phase: the re-plans fall on steps equal to replan_phase modulo k (0 <= phase < k; before
        the first such step, step 0 placed): a simulation that averages a step over its cycle's phases
        sets it.
    At step 0 there is no history: the prediction is uniform, so EPLB packs by index.
    """

    name: ClassVar[str] = "eplb"
    window: int = 4
    redundant_slots_per_gpu: int = 2
    num_groups: int | None = None
    relabel: bool = True
    replan_interval: int = 1
    replan_phase: int = 0

    def __post_init__(self):
        check_nonnegative_int(self.name, window=self.window, redundant_slots_per_gpu=self.redundant_slots_per_gpu,
                              num_groups=self.num_groups)
        if self.window < 1:
            raise ConfigError(f"policy {self.name!r}: window must be at least 1 step, got {self.window}")
        if self.num_groups is not None and self.num_groups < 1:
            raise ConfigError(f"policy {self.name!r}: num_groups must be positive, got {self.num_groups}")
        check_replan(self.name, self.relabel, self.replan_interval, self.replan_phase)

    def predicted_load(self, trace: RoutingTrace, step: int) -> np.ndarray:
        """float64 [layers, experts] tokens per expert EPLB is fed for `step`."""
        lo = max(0, step - self.window)
        if step == lo:
            return np.ones((trace.num_layers, trace.num_experts))
        return trace.loads[lo:step].sum(axis=(0, 1, 3), dtype=np.float64) / (step - lo)

    def copies(self, trace: RoutingTrace, step: int, gpus_per_node: int,
               prev_home: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, str, int]:
        """(held [L, E, ep], home [L, E], replica_scope, slots_per_gpu) for `step`: EPLB run on the
        prediction of the step that last re-planned (replan_step), relabelled onto prev_home."""
        placed = replan_step(step, self.replan_interval, self.replan_phase)
        return eplb_copies(self.predicted_load(trace, placed), trace.ep,
                           gpus_per_node, self.redundant_slots_per_gpu, self.num_groups, prev_home, self.relabel)

    def _plan(self, trace: RoutingTrace, step: int, topology: Topology, gpus_per_node: int,
              prev_home: np.ndarray | None) -> StepPlan:
        start, start_cpu = time.perf_counter(), time.process_time()
        held, home, scope, slots = self.copies(trace, step, gpus_per_node, prev_home)
        rebalance_s, rebalance_cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
        plan = plan_from_copies(self.name, trace.loads[step], held, home, gpus_per_node, slots, scope)
        plan.info = EplbInfo(rebalance_seconds=rebalance_s, rebalance_cpu_seconds=rebalance_cpu_s,
                             copies_per_expert_max=int(held.sum(axis=2).max()))
        return plan


def replan_step(step: int, replan_interval: int, replan_phase: int = 0) -> int:
    """The step whose loads placed `step`: the last step at or before it equal to replan_phase modulo
    replan_interval (step 0 before the first one)."""
    return max(0, step - (step - replan_phase) % replan_interval)


def check_replan(policy: str, relabel, replan_interval, replan_phase: int = 0) -> None:
    """ConfigError unless relabel is a bool, replan_interval a positive integer and replan_phase an integer in
    [0, replan_interval)."""
    if not isinstance(relabel, (bool, np.bool_)):
        raise ConfigError(f"policy {policy!r}: relabel must be true or false, got {relabel!r}")
    if isinstance(replan_interval, bool) or not isinstance(replan_interval, (int, np.integer)) or replan_interval < 1:
        raise ConfigError(f"policy {policy!r}: replan_interval must be a positive number of steps, "
                          f"got {replan_interval!r}")
    if (isinstance(replan_phase, bool) or not isinstance(replan_phase, (int, np.integer))
            or not 0 <= replan_phase < replan_interval):
        raise ConfigError(f"policy {policy!r}: replan_phase must be an integer in [0, replan_interval = "
                          f"{replan_interval}), got {replan_phase!r}")


@register
@dataclass
class EplbOraclePolicy(EplbPolicy):
    """`eplb+`: EPLB fed the current step's exact loads (an oracle the replayed routing provides).

    Its copies are fixed for the step and pushed into the replica buffer like any plan's replicas, so the
    cost model charges them as it charges ReLibra's (the same buffer, overlap and overheads).
    EPLB_PLUS_VARIANTS names it by spare slots per GPU; PAPER_EPLB_PLUS is the paper's baseline.
    """

    name: ClassVar[str] = "eplb+"

    def predicted_load(self, trace: RoutingTrace, step: int) -> np.ndarray:
        return trace.loads[step].sum(axis=(0, 2), dtype=np.float64)


# EPLB+ by spare (redundant) slots per GPU: get_policy("eplb+", **EPLB_PLUS_VARIANTS[label]). 0 slots is
# EPLB's placement alone (no replicas, nothing pushed); 2 is ReLibra's default buffer; 4 twice that.
EPLB_PLUS_VARIANTS: dict[str, dict] = {f"eplb+ {s} slots": {"redundant_slots_per_gpu": s} for s in (0, 2, 4)}
# The paper's EPLB+: "all replication baselines share ReLibra's replica buffer and overlap" (its evaluation,
# from a second-hand summary): ReLibra's spare slots (2), its layer-shared buffer, its transfers overlapped
# with attention and charged by the same terms.
PAPER_EPLB_PLUS = "eplb+ 2 slots"
