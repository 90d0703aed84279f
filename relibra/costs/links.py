"""Links and all-to-all: seconds of point-to-point exchanges on a topology, and the distinct tokens a
deduplicating dispatcher (DeepEP) sends.

Bandwidths are GB/s = 1e9 bytes/s one direction per GPU; a GPU's NVLink and RDMA links run at the
same time, each full duplex, so its transfer time is the largest of its four (link, direction) byte
counts over that link's rate; the slowest GPU sets the time of a collective, which pays the
topology's `collective_latency_s` once.
"""

from __future__ import annotations

import numpy as np

from relibra.cluster import Topology
from relibra.costs.params import ROUTES
from relibra.errors import ConfigError
from relibra.plan import StepPlan


def link_seconds(bytes_matrix: np.ndarray, gpus_per_node: int, topology: Topology, route: str | None = None,
                 node_bytes: np.ndarray | None = None) -> np.ndarray:
    """Per-GPU transfer seconds of a point-to-point exchange, without latency.

    bytes_matrix: float [..., ep_src, ep_dst] bytes from each GPU to each GPU (the diagonal stays local
    and is free). GPUs are packed gpus_per_node to a node; each has NVLink inside its node and one RDMA
    NIC; its four (link, direction) streams run at once, each full duplex.
    route: how a byte crosses nodes.
      "rail" (DeepEP's internode kernels, NCCL's rail-aligned path): from the sender's NIC to the NIC
        of the GPU with the sender's local index in the destination node, then over NVLink to the
        destination. The exchange that mirrors it (combine after dispatch, a gradient after its
        weight) takes the same links backwards, so it costs the same.
      "direct": from the sender's NIC straight to the destination's NIC.
      None: the topology's `route`. A topology with `shared_link` (one machine's loopback) has a single
        link per GPU at nvlink_GBps: its time is max(all bytes sent, all bytes received) / nvlink_GBps.
    node_bytes: optional float [..., ep_src, nodes] bytes each GPU sends over RDMA into each node on
        the rail route, when fewer than the per-GPU bytes (a token sent once per node, see
        distinct_tokens); default: bytes_matrix summed over each node's GPUs.
    Returns float64 [..., ep]: per GPU, the larger of max(send, recv) NVLink bytes / nvlink_GBps and
    max(send, recv) RDMA bytes / rdma_GBps.
    """
    route = topology.route if route is None else route
    if route not in ROUTES:
        raise ConfigError(f"route must be one of {ROUTES}, got {route!r}")
    x = np.asarray(bytes_matrix, dtype=np.float64)
    ep = x.shape[-1]
    g = gpus_per_node
    n = ep // g
    lead = x.shape[:-2]
    gpu = np.arange(ep)
    diag = x[..., gpu, gpu].reshape(*lead, n, g)
    x4 = x.reshape(*lead, n, g, n, g)  # [..., src node, src local, dst node, dst local]
    to_node = x4.sum(axis=-1)  # [..., Ns, Ls, Nd]
    own_to = np.diagonal(to_node, axis1=-3, axis2=-1)  # [..., Ls, N]: bytes kept inside the sender's node
    own_to = np.swapaxes(own_to, -1, -2)  # [..., Ns, Ls]
    intra_send = own_to - diag
    if node_bytes is not None and route == "rail":
        rail_to_node = np.asarray(node_bytes, dtype=np.float64).reshape(*lead, n, g, n)
        rail_own = np.diagonal(rail_to_node, axis1=-3, axis2=-1)  # [..., Ls, N]
        rdma_send = rail_to_node.sum(axis=-1) - np.swapaxes(rail_own, -1, -2)
    else:
        rail_to_node, rail_own = to_node, np.swapaxes(own_to, -1, -2)
        rdma_send = to_node.sum(axis=-1) - own_to  # [..., Ns, Ls]
    from_node = x4.sum(axis=-4)  # [..., Ls, Nd, Ld]: bytes arriving per (sender local, dst)
    own_from = np.moveaxis(np.diagonal(x4, axis1=-4, axis2=-2), -1, -2)  # [..., Ls, Nd, Ld] same-node part
    intra_recv = own_from.sum(axis=-3) - diag  # [..., Nd, Ld]
    cross = from_node - own_from  # [..., Ls, Nd, Ld]: cross-node bytes by sender local index
    if route == "direct":
        rdma_recv = cross.sum(axis=-3)
        nvl_send, nvl_recv = intra_send, intra_recv
    else:
        # NIC (Nd, Li) receives what every other node's local-i GPU sends into node Nd
        rdma_recv = np.swapaxes(rail_to_node.sum(axis=-3) - rail_own, -1, -2)  # [..., Nd, Li]
        # what arrives on the rail of the destination itself needs no NVLink hop
        on_own_rail = np.diagonal(cross, axis1=-3, axis2=-1)  # [..., Nd, L]
        relayed = cross.sum(axis=-3) - on_own_rail  # [..., Nd, Ld] NVLink bytes into each destination
        relay_out = np.swapaxes(cross.sum(axis=-1), -1, -2) - on_own_rail  # [..., Nd, Li] bytes each relay forwards
        nvl_send, nvl_recv = intra_send + relay_out, intra_recv + relayed
    if topology.shared_link:
        both = np.maximum(nvl_send + rdma_send, nvl_recv + rdma_recv)
        return (np.maximum(both, 0.0) / topology.nvlink_bytes_per_s).reshape(*lead, ep)
    nvl = np.maximum(np.maximum(nvl_send, nvl_recv), 0.0) / topology.nvlink_bytes_per_s
    rdma = np.maximum(np.maximum(rdma_send, rdma_recv), 0.0) / topology.rdma_bytes_per_s
    return np.maximum(nvl, rdma).reshape(*lead, ep)


def collective_seconds(bytes_matrix: np.ndarray, gpus_per_node: int, topology: Topology,
                       route: str | None = None, node_bytes: np.ndarray | None = None) -> np.ndarray:
    """Seconds of one exchange set by its slowest GPU, plus the launch latency where anything moves.

    bytes_matrix: [..., ep, ep]; route, node_bytes: see link_seconds. Returns float64 [...] (0 where
    nothing crosses a link).
    """
    per_gpu = link_seconds(bytes_matrix, gpus_per_node, topology, route, node_bytes)
    slowest = per_gpu.max(axis=-1)
    return np.where(slowest > 0, slowest + topology.collective_latency_s, 0.0)


def distinct_tokens(plan: StepPlan, src_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Estimated distinct tokens each source sends each GPU and each node (a token routed to several
    expert copies there travels once, as DeepEP sends it).

    Every copy c of an expert takes a share pi_c = (tokens of this source it receives) / (the
    source's tokens) of the source's tokens; taking the copies' memberships as independent, a token
    reaches a set X of copies with probability 1 - prod_{c in X} (1 - pi_c). Exact when each set
    holds one copy; otherwise an estimate (top-k picks are in truth slightly anti-correlated).
    src_tokens: [M, ep] tokens (not pairs) per source rank.
    Returns (per GPU float64 [M, L, ep_src, ep_dst], per node float64 [M, L, ep_src, nodes]).
    """
    m, l, ep, e = plan.loads.shape
    tokens = np.asarray(src_tokens, dtype=np.float64)
    inv = np.where(tokens > 0, 1.0 / np.where(tokens > 0, tokens, 1.0), 0.0).astype(np.float32)  # [M, ep]
    home_onehot = (plan.home[:, :, None] == np.arange(ep)).astype(np.float32)  # [L, E, ep]
    home_flow = plan.home_flow().astype(np.float32)  # float32 is exact for these counts
    mi, li, gi, ri = np.nonzero(plan.replica_expert >= 0)
    if len(mi):
        flows = plan.replica_flow[mi, li, :, gi, ri].astype(np.float32)  # [n, src]
        src = np.arange(ep)[None, :]
    one = np.float32(1.0 - 1e-6)
    share = home_flow * inv[:, None, :, None]
    np.minimum(share, one, out=share)
    np.log1p(-share, out=share)
    log_miss = np.matmul(share, home_onehot)  # [M, L, src, gpu]
    if len(mi):
        rep_share = np.minimum(flows * inv[mi], one)
        np.add.at(log_miss, (mi[:, None], li[:, None], src, gi[:, None]), np.log1p(-rep_share))
    gpn = plan.gpus_per_node
    log_miss = log_miss.astype(np.float64)
    tokens = tokens[:, None, :, None]
    per_gpu = tokens * -np.expm1(log_miss)
    per_node = tokens * -np.expm1(log_miss.reshape(m, l, ep, ep // gpn, gpn).sum(axis=-1))
    return per_gpu, per_node
