"""Links and all-to-all: seconds of point-to-point exchanges on a topology, and the distinct tokens a
deduplicating dispatcher (DeepEP) sends.

Bandwidths are GB/s = 1e9 bytes/s one direction per GPU. Every exchange is first counted as per-GPU
NVLink and RDMA send and receive bytes (LinkBytes: from a list of moves, or from dense matrices for
the all-to-all), then turned into seconds by one function, link_seconds_of: a GPU's links run at the
same time, each full duplex, so its transfer time is the largest of its four (link, direction) byte
counts over that link's rate; the slowest GPU sets the time of a collective, which pays the
topology's `collective_latency_s` once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relibra.cluster import Topology
from relibra.costs.params import ROUTES
from relibra.errors import ConfigError
from relibra.plan import HomeGroups, StepPlan, scatter_rows


@dataclass
class LinkBytes:
    """Bytes each GPU sends and receives on each of its links in an exchange: float64 [..., ep] each.
    On the rail route a cross-node byte is counted on the relay's NVLink as well as on the RDMA links."""

    nvlink_send: np.ndarray
    nvlink_recv: np.ndarray
    rdma_send: np.ndarray
    rdma_recv: np.ndarray


def link_seconds_of(link_bytes: LinkBytes, topology: Topology) -> np.ndarray:
    """The one function from per-GPU link bytes to seconds (no latency): float64 [..., ep].

    A GPU's NVLink and RDMA links run at the same time, each full duplex: its time is the larger of
    max(send, recv) NVLink bytes / nvlink rate and max(send, recv) RDMA bytes / rdma rate. A topology
    with `shared_link` (one machine's loopback) has one link per GPU at the NVLink rate:
    max(all bytes sent, all bytes received) / nvlink rate.
    """
    b = link_bytes
    if topology.shared_link:
        both = np.maximum(b.nvlink_send + b.rdma_send, b.nvlink_recv + b.rdma_recv)
        return np.maximum(both, 0.0) / topology.nvlink_bytes_per_s
    nvl = np.maximum(np.maximum(b.nvlink_send, b.nvlink_recv), 0.0) / topology.nvlink_bytes_per_s
    rdma = np.maximum(np.maximum(b.rdma_send, b.rdma_recv), 0.0) / topology.rdma_bytes_per_s
    return np.maximum(nvl, rdma)


def _check_route(topology: Topology, route: str | None) -> str:
    route = topology.route if route is None else route
    if route not in ROUTES:
        raise ConfigError(f"route must be one of {ROUTES}, got {route!r}")
    return route


def link_bytes_of_moves(cell: np.ndarray, src: np.ndarray, dst: np.ndarray, weight, cells: int, ep: int,
                        gpus_per_node: int, route: str) -> LinkBytes:
    """Per-GPU link bytes of `cells` exchanges given as moves: move i sends weight[i] bytes (an array,
    or one number for all) from GPU src[i] to GPU dst[i] in exchange cell[i]; moves that repeat add
    up; a move to itself is free. Returns LinkBytes of float64 [cells, ep].

    Inside a node a byte takes NVLink. Across nodes, route "direct": from the sender's NIC straight
    to the destination's NIC; "rail" (DeepEP's internode kernels, NCCL's rail-aligned path): from the
    sender's NIC to the NIC of the GPU with the sender's local index in the destination node (the
    relay), then over NVLink to the destination. The mirrored exchange (combine after dispatch, a
    gradient after its weight) takes the same links backwards, so it costs the same.
    """
    g = gpus_per_node
    cell, src, dst = (np.asarray(a, dtype=np.int64) for a in (cell, src, dst))
    weight = np.broadcast_to(np.asarray(weight, dtype=np.float64), cell.shape)
    moving = src != dst
    cell, src, dst, weight = cell[moving], src[moving], dst[moving], weight[moving]
    size = cells * ep

    def per_gpu(where, gpu):  # bytes summed per (cell, GPU) over the moves selected by `where`
        return np.bincount(cell[where] * ep + gpu[where], weights=weight[where], minlength=size).reshape(cells, ep)

    same = src // g == dst // g
    cross = ~same
    nvl_send, nvl_recv = per_gpu(same, src), per_gpu(same, dst)
    rdma_send = per_gpu(cross, src)
    if route == "direct":
        rdma_recv = per_gpu(cross, dst)
    else:
        relay = dst // g * g + src % g
        rdma_recv = per_gpu(cross, relay)
        hop = cross & (relay != dst)
        nvl_send = nvl_send + per_gpu(hop, relay)
        nvl_recv = nvl_recv + per_gpu(hop, dst)
    return LinkBytes(nvl_send, nvl_recv, rdma_send, rdma_recv)


def link_bytes_of_matrix(bytes_matrix: np.ndarray, gpus_per_node: int, route: str,
                         node_bytes: np.ndarray | None = None) -> LinkBytes:
    """Per-GPU link bytes of dense exchanges: the same links and routes as link_bytes_of_moves, with
    every (src, dst) pair a move, summed by einsum over node blocks (an all-to-all is dense: every
    source sends to every GPU, and a list of its moves would be slower to count).

    bytes_matrix: float [..., ep_src, ep_dst] (the diagonal stays local and is free). node_bytes:
    optional float [..., ep_src, nodes] bytes each GPU sends over RDMA into each node on the rail
    route, when fewer than the per-GPU bytes (a token sent once per node, see distinct_tokens);
    default: bytes_matrix summed over each node's GPUs. Returns LinkBytes of float64 [..., ep].
    """
    x = np.asarray(bytes_matrix, dtype=np.float64)
    ep = x.shape[-1]
    g = gpus_per_node
    n = ep // g
    lead = x.shape[:-2]
    gpu = np.arange(ep)
    diag = x[..., gpu, gpu].reshape(*lead, n, g)
    x4 = x.reshape(*lead, n, g, n, g)  # [..., src node, src local, dst node, dst local]
    blocks = np.diagonal(x4, axis1=-4, axis2=-2)  # [..., Ls, Ld, N]: bytes kept inside each node
    own_to = np.moveaxis(blocks.sum(axis=-2), -1, -2)  # [..., Ns, Ls]
    intra_send = own_to - diag
    if node_bytes is not None and route == "rail":
        rail_to_node = np.asarray(node_bytes, dtype=np.float64).reshape(*lead, n, g, n)
        rail_own = np.diagonal(rail_to_node, axis1=-3, axis2=-1)  # [..., Ls, N]
        rdma_send = rail_to_node.sum(axis=-1) - np.swapaxes(rail_own, -1, -2)
    else:
        to_node = np.einsum("...abcd->...abc", x4)  # [..., Ns, Ls, Nd] (einsum: fast on any layout)
        rail_to_node, rail_own = to_node, np.swapaxes(own_to, -1, -2)
        rdma_send = to_node.sum(axis=-1) - own_to  # [..., Ns, Ls]
    from_node = np.einsum("...abcd->...bcd", x4)  # [..., Ls, Nd, Ld]: bytes arriving per (sender local, dst)
    own_from = np.moveaxis(blocks, -1, -2)  # [..., Ls, Nd, Ld] same-node part
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
    return LinkBytes(*(a.reshape(*lead, ep) for a in (nvl_send, nvl_recv, rdma_send, rdma_recv)))


def link_seconds(bytes_matrix: np.ndarray, gpus_per_node: int, topology: Topology, route: str | None = None,
                 node_bytes: np.ndarray | None = None) -> np.ndarray:
    """Per-GPU transfer seconds of dense point-to-point exchanges, without latency: float64 [..., ep].
    bytes_matrix [..., ep_src, ep_dst], node_bytes: see link_bytes_of_matrix; route None: the
    topology's."""
    return link_seconds_of(link_bytes_of_matrix(bytes_matrix, gpus_per_node, _check_route(topology, route),
                                                node_bytes), topology)


def sparse_link_seconds(cell: np.ndarray, src: np.ndarray, dst: np.ndarray, weight, cells: int, ep: int,
                        gpus_per_node: int, topology: Topology, route: str | None = None) -> np.ndarray:
    """Per-GPU transfer seconds of exchanges given as moves (link_bytes_of_moves): float64 [cells, ep]."""
    return link_seconds_of(link_bytes_of_moves(cell, src, dst, weight, cells, ep, gpus_per_node,
                                               _check_route(topology, route)), topology)


def collective_seconds(bytes_matrix: np.ndarray, gpus_per_node: int, topology: Topology,
                       route: str | None = None, node_bytes: np.ndarray | None = None) -> np.ndarray:
    """Seconds of one exchange set by its slowest GPU, plus the launch latency where anything moves.

    bytes_matrix: [..., ep, ep]; route, node_bytes: see link_seconds. Returns float64 [...] (0 where
    nothing crosses a link).
    """
    per_gpu = link_seconds(bytes_matrix, gpus_per_node, topology, route, node_bytes)
    slowest = per_gpu.max(axis=-1)
    return np.where(slowest > 0, slowest + topology.collective_latency_s, 0.0)


# One copy's share of a source's tokens is capped just below 1, so that a copy taking every token of
# a source still leaves the product of misses positive.
SHARE_CAP = float(np.float32(1.0 - 1e-6))


def distinct_tokens(plan: StepPlan, src_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Estimated distinct tokens each source sends each GPU and each node (a token routed to several
    expert copies there travels once, as DeepEP sends it).

    Every copy c of an expert takes a share pi_c = (tokens of this source it receives) / (the
    source's tokens) of the source's tokens (capped at SHARE_CAP); taking the copies' memberships as
    independent, a token reaches a set X of copies with probability 1 - prod_{c in X} (1 - pi_c).
    Exact when each set holds one copy; otherwise an estimate (top-k picks are in truth slightly
    anti-correlated).
    src_tokens: [M, ep] tokens (not pairs) per source rank.
    Returns (per GPU float64 [M, L, ep_src, ep_dst], per node float64 [M, L, ep_src, nodes]).
    The simulator takes them layer by layer (layer_distinct_tokens) instead.
    """
    m, l, ep, e = plan.loads.shape
    per_gpu = np.empty((m, l, ep, ep))
    per_node = np.empty((m, l, ep, ep // plan.gpus_per_node))
    for layer, gpu, node in layer_distinct_tokens(plan, src_tokens):
        per_gpu[:, layer] = gpu
        per_node[:, layer] = node
    return per_gpu, per_node


def layer_distinct_tokens(plan: StepPlan, src_tokens: np.ndarray, scale: float = 1.0):
    """distinct_tokens one layer at a time: yields (layer, per GPU float64 [M, ep_src, ep_dst], per
    node float64 [M, ep_src, nodes]), each times `scale` (bytes per token, say). Both are views of
    buffers reused from one layer to the next: use or copy them before taking the next layer.

    Works in float64 on products of misses, sources last: per (micro_batch, GPU, src) the product of
    (1 - share) over the GPU's homed experts (their home flows) and its occupied replicas.
    """
    m, l, ep, e = plan.loads.shape
    gpn = plan.gpus_per_node
    nodes = ep // gpn
    tokens = np.asarray(src_tokens, dtype=np.float64)
    inv = np.where(tokens > 0, 1.0 / np.where(tokens > 0, tokens, 1.0), 0.0)  # [M, src]
    neg_inv = -inv[:, None, :]
    scaled = (tokens * scale)[:, None, :]
    groups = HomeGroups(plan.home, ep)
    factor = np.empty((m, e, ep))  # 1 - share of each (expert, src), experts grouped by home
    miss = factor if groups.per_gpu == 1 else np.empty((m, ep, ep))  # [M, dst, src]
    node_miss = np.empty((m, nodes, ep))
    per_gpu, per_node = np.empty((m, ep, ep)), np.empty((m, nodes, ep))
    for flow in plan.layer_flows(groups):
        np.multiply(flow.home_flow, neg_inv, out=factor)
        np.maximum(factor, -SHARE_CAP, out=factor)
        factor += 1.0
        groups.reduce(np.multiply, factor, flow.layer, miss)
        mi, gi, _ = flow.slots
        if len(mi):
            rep = inv[mi]  # [n, src] -> 1 - each replica's share
            rep *= flow.rows
            np.minimum(rep, SHARE_CAP, out=rep)
            np.subtract(1.0, rep, out=rep)
            scatter_rows(np.multiply, miss, mi, gi, rep)
        np.subtract(1.0, miss, out=per_gpu)
        per_gpu *= scaled
        np.multiply.reduce(miss.reshape(m, nodes, gpn, ep), axis=2, out=node_miss)
        np.subtract(1.0, node_miss, out=per_node)
        per_node *= scaled
        yield flow.layer, per_gpu.transpose(0, 2, 1), per_node.transpose(0, 2, 1)
