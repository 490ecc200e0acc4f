"""Alpha-beta costs of collectives on the link each process group actually uses.

Ring algorithms (what NCCL and gloo use for large messages): for a group of n and a message of S bytes,
all-reduce moves 2(n-1)/n S per device and all-gather / reduce-scatter (n-1)/n S, where S is the full
(unsharded) size. Link bandwidths in a cluster profile are *bus* bandwidths (nccl-tests busbw), which
already fold those ring factors' efficiency in, so

    t = base + hops * latency + factor * S / busbw,  factor = 2(n-1)/n or (n-1)/n,  hops = 2(n-1) or (n-1),

which is NCCL's own ring cost model (src/graph/tuning.cc: ``baseLat`` once, ``hwLat`` per step, bytes over
the bus bandwidth); ``base`` is the cluster's ``collective_latency_us``.

Which link a group uses follows from its span in the rank order (``ParallelDims.span``,
schema/parallel_dims.py): consecutive ranks fill a node first, so a TP group is stride 1, a CP group
stride tp (inside a node when tp x cp <= devices per node), and the dp x cp ranks that reduce gradients
together stride tp. A group whose members span nodes with g members per node is limited by
min(intra-node bandwidth, g x the per-device inter-node bandwidth): every member drives its own NIC
(rail-optimised rings, one NIC per GPU as in DGX nodes).

A cluster with measured fits (``Cluster.collectives``, gloo on a CPU host) prices a group of n by the fit
of its collective at n instead: t = alpha + factor * S / busbw, alpha and busbw as measured with the
node's ranks all running (schema/cluster.py). A TP group's collectives take the ``tp_*`` fits where
there are some: measured as DTensor issues them inside a layer, they carry DTensor's own work and the
skew of ranks that reach them out of step (profiler/hardware/distributed_overhead.py).

All-to-all (MoE token dispatch and combine over the EP group): every rank sends S / n to each of the n - 1
others (S: the rank's whole send buffer, its own share included), issued by NCCL as grouped send/recv
pairs (nccl-tests doc/PERFORMANCE.md: alltoall busBw = algBw x (n-1)/n), so

    t = base + (n-1) * latency + (n-1)/n * S / busbw.

Inside a node busbw is the NVLink bus bandwidth. Across nodes the ring trick that lets g members per node
pool their NICs does not apply: each rank pushes its (n - g)/n off-node share through its own NIC while the
(g - 1)/n on-node share goes over NVLink at the same time, so the all-to-all's bus bandwidth is
min((n-1)/(n-g) x NIC, (n-1)/(g-1) x NVLink) (``GroupLink.all_to_all_bandwidth_bytes_per_s``).

A node-deduplicating dispatcher (DeepEP's normal kernels, HybridEP: a stack's ``ep_dispatcher: deduplicated``)
sends less: a token crosses the network once per remote node that holds one of its experts and is forwarded
over NVLink there (DeepSeek-V3 section 3.2.2); ``routed_copies`` counts the copies, ``hierarchical_exchange_s``
prices them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from math import comb
from typing import Literal

from autoplan.schema import Cluster
from autoplan.schema.cluster import CollectiveFit
from autoplan.schema.parallel_dims import GroupSpan

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]


@dataclass(frozen=True)
class GroupLink:
    """The effective link of one process group: bus bandwidth (bytes/s) and per-hop latency (s)."""

    size: int
    bandwidth_bytes_per_s: float
    latency_s: float
    base_latency_s: float = 0.0
    """Fixed start-up cost of one collective on this group."""
    fits: tuple[CollectiveFit, ...] = ()
    """Measured fits for this group size, one per collective (they replace the link formula)."""
    wait_factor: float = 1.0
    """Cluster.collective_wait_factor: scales the fits' alpha inside a training step."""
    all_to_all_bandwidth_bytes_per_s: float = 0.0
    """Bus bandwidth of an all-to-all on this group (module doc); 0: ``bandwidth_bytes_per_s``."""

    def fit(self, kind: str) -> CollectiveFit | None:
        return next((f for f in self.fits if f.collective == kind), None)


def group_link(cluster: Cluster, span: GroupSpan, tensor_parallel: bool = False) -> GroupLink:
    """Link of one group of the layout (``ParallelDims.span``: its size and member stride);
    ``tensor_parallel``: the TP group, whose collectives DTensor issues (the ``tp_*`` fits)."""
    per_node = cluster.devices_per_node
    intra = cluster.intra_node
    base = cluster.collective_latency_us * 1e-6
    size = span.size
    fits = tuple(f for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
                 if (f := _fit(cluster, kind, size, tensor_parallel)) is not None) if size > 1 else ()
    if span.fits_in_node(per_node):
        return GroupLink(size, intra.bandwidth_gb_per_s * 1e9, intra.latency_us * 1e-6, base, fits,
                         cluster.collective_wait_factor)
    members = span.members_per_node(per_node)
    inter_bw = min(intra.bandwidth_gb_per_s, members * cluster.inter_node.bandwidth_gb_per_s)
    return GroupLink(size, inter_bw * 1e9, cluster.inter_node.latency_us * 1e-6, base, fits,
                     cluster.collective_wait_factor, _all_to_all_bandwidth(cluster, size, members) * 1e9)


def _all_to_all_bandwidth(cluster: Cluster, size: int, members_per_node: int) -> float:
    """GB/s of an all-to-all bus bandwidth over ``size`` ranks, ``members_per_node`` of them on each node
    (module doc): the off-node share through each rank's NIC, the on-node share over NVLink, at once."""
    n, g = size, min(members_per_node, size)
    nic = (n - 1) / (n - g) * cluster.inter_node.bandwidth_gb_per_s
    if g <= 1:
        return nic
    return min(nic, (n - 1) / (g - 1) * cluster.intra_node.bandwidth_gb_per_s)


def _fit(cluster: Cluster, kind: str, size: int, tensor_parallel: bool) -> CollectiveFit | None:
    if tensor_parallel:
        tp = cluster.collective_fit(f"tp_{kind}", size)
        if tp is not None:
            return dataclasses.replace(tp, collective=kind)
    return cluster.collective_fit(kind, size)


def collective_time_s(kind: Collective, size_bytes: float, link: GroupLink) -> float:
    if size_bytes <= 0:
        return 0.0
    return collective_latency_s(kind, link) + collective_bandwidth_s(kind, size_bytes, link)


def collective_latency_s(kind: Collective, link: GroupLink) -> float:
    """The alpha term: the start-up cost, then 2(n-1) hops for an all-reduce, n-1 for the others (an
    all-to-all: one send/recv step per peer)."""
    n = link.size
    if n <= 1:
        return 0.0
    fit = link.fit(kind)
    if fit is not None:
        return fit.alpha_us * 1e-6 * link.wait_factor
    return link.base_latency_s + (2 * (n - 1) if kind == "all_reduce" else n - 1) * link.latency_s


def collective_bandwidth_s(kind: Collective, size_bytes: float, link: GroupLink) -> float:
    """The beta term: 2(n-1)/n of the full size for an all-reduce, (n-1)/n for the others (for an all-to-all
    the full size is one rank's send buffer, the share that stays on the rank included)."""
    n = link.size
    if n <= 1:
        return 0.0
    factor = 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n
    fit = link.fit(kind)
    if fit is not None:
        return factor * size_bytes / (fit.busbw_gb_per_s * 1e9)
    bandwidth = link.bandwidth_bytes_per_s
    if kind == "all_to_all" and link.all_to_all_bandwidth_bytes_per_s > 0:
        bandwidth = link.all_to_all_bandwidth_bytes_per_s
    return factor * size_bytes / bandwidth


def p2p_time_s(cluster: Cluster, size_bytes: float, same_node: bool) -> float:
    """One send/recv between two ranks: latency + bytes / bandwidth of the link between them (the measured
    send_recv fit within a node where the cluster has one)."""
    fit = cluster.collective_fit("send_recv", 2) if same_node else None
    if fit is not None:
        return fit.alpha_us * 1e-6 * cluster.collective_wait_factor + size_bytes / (fit.busbw_gb_per_s * 1e9)
    link = cluster.intra_node if same_node else cluster.inter_node
    return link.latency_us * 1e-6 + size_bytes / (link.bandwidth_gb_per_s * 1e9)


def hierarchical_exchange_s(cluster: Cluster, network_bytes: float, nvlink_bytes: float, ranks: int) -> float:
    """One dispatch or combine of a node-deduplicating dispatcher (DeepEP's normal kernels, HybridEP; cost/
    moe_ops.py ``routed_copies``): every rank sends ``network_bytes`` through its own NIC and ``nvlink_bytes``
    over NVLink at once, pipelined in one kernel, so the slower path sets the time (deepseek-ai/DeepEP README,
    normal kernels: the internode kernels' "bottleneck bandwidth" is the RDMA one, near the NIC's line rate,
    which the cluster's per-GPU inter-node bandwidth already is); plus one start-up and one network (or NVLink)
    step, as a collective."""
    net = network_bytes / (cluster.inter_node.bandwidth_gb_per_s * 1e9)
    nvl = nvlink_bytes / (cluster.intra_node.bandwidth_gb_per_s * 1e9)
    if ranks <= 1 or max(net, nvl) <= 0:
        return 0.0
    step = cluster.inter_node.latency_us if network_bytes > 0 else cluster.intra_node.latency_us
    return (cluster.collective_latency_us + step) * 1e-6 + max(net, nvl)


def routed_copies(experts: int, k: int, ep: int, ranks_per_node: int, node_limit: int | None = None
                  ) -> tuple[float, float]:
    """(remote nodes, remote ranks) one token's k routed copies reach, expected under uniform (force-balanced)
    routing, when ``experts`` lie evenly over ``ep`` ranks, ``ranks_per_node`` of them on each node.

    A dispatcher that deduplicates per node (DeepSeek-V3 technical report sec. 3.2.2: each token crosses
    InfiniBand once per destination node and is forwarded to the node's GPUs over NVLink; DeepEP's normal
    kernels and NVIDIA's HybridEP, Megatron-Core token_dispatcher.py ``MoEFlexTokenDispatcher``, do the same)
    sends a token over the network once per remote node its experts lie on, not once per copy as NCCL's
    all-to-all (``routed_ops``) does. ``node_limit``: node-limited routing (DeepSeek-V3's M = 4 of 8 groups,
    each group the experts of one node under ep 64), the k experts drawn among those of ``node_limit`` nodes.

    With the chosen nodes' E' = node_limit x E / nodes experts, a node (a rank) is missed by all k draws with
    probability C(E' - E/nodes, k) / C(E', k) (C(E' - E/ep, k) / C(E', k)); by symmetry (nodes - 1) / nodes of
    the nodes hit are remote, (ep - 1) / ep of the ranks hit are another rank."""
    if experts % ep or ep % min(ep, ranks_per_node):
        raise ValueError(f"routed_copies: {experts} experts over ep {ep} ranks, {ranks_per_node} per node")
    per_node = min(ep, ranks_per_node)
    nodes = ep // per_node
    chosen = nodes if node_limit is None else min(node_limit, nodes)
    pool = chosen * experts // nodes
    if k > pool:
        raise ValueError(f"routed_copies: top-{k} among the {pool} experts of {chosen} nodes")
    node_hit = 1 - comb(pool - experts // nodes, k) / comb(pool, k)
    rank_hit = 1 - comb(pool - experts // ep, k) / comb(pool, k)
    return chosen * node_hit * (nodes - 1) / nodes, chosen * per_node * rank_hit * (ep - 1) / ep
