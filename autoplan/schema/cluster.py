"""A cluster: identical nodes of identical devices, one link inside a node and one between nodes.

Link bandwidths are *achievable bus bandwidth per device* (what nccl-tests reports as busbw for large
messages), not line rates, so the collective formulas need no further efficiency factor. A collective
costs ``collective_latency_us`` once plus ``latency_us`` per ring step (NCCL's own cost model, its
``baseLat`` and ``hwLat`` in src/graph/tuning.cc), plus its bytes over the bus bandwidth. Ranks are laid
out node by node: global rank = node * devices_per_node + local rank.

A CPU host (``cores_per_node`` > 0) is different in two ways the cost model follows:

* its ranks share the node's cores: while more ranks compute than there are cores, each computes at
  cores / busy ranks of its own speed (time-slicing; cost/stage_table.py ``core_share``);
* gloo's collectives run on those same cores, so they do not overlap compute: every FSDP2 all-gather
  and reduce-scatter is paid where the runtime issues it, with its measured latency.

``collectives`` holds measured alpha-beta fits of one machine (``autoplan calibrate``): per collective,
group size and number of ranks running on the node at the time (gloo on a shared CPU slows down when
ranks outnumber cores, so a fit holds for the rank count it was measured at). Where a fit matches a
group, it prices that group's collectives instead of the link formula.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autoplan.schema._io import require, require_physical, require_range
from autoplan.schema.hardware import DeviceProfile, Residual
from autoplan.schema.limits import MAX_DEVICES, MAX_DEVICES_PER_NODE, MAX_NODES


@dataclass(frozen=True)
class Link:
    bandwidth_gb_per_s: float
    """Achievable bus bandwidth per device, 10^9 bytes/s, one direction."""
    latency_us: float
    """Per-hop (alpha) latency of one ring step, microseconds."""

    def validate(self) -> None:
        require_physical(self)  # bandwidth in (0, 1e9] GB/s, latency in [0, 1e8] us


@dataclass(frozen=True)
class CollectiveFit:
    """t(S) = alpha + factor * S / busbw for one collective (S the full, unsharded bytes; factor 2(n-1)/n
    for all-reduce, (n-1)/n for all-gather and reduce-scatter, 1 for send_recv), measured with
    ``group_size`` ranks per group while ``ranks`` ranks ran on the node, every group at once.
    ``tp_all_reduce`` / ``tp_all_gather`` / ``tp_reduce_scatter``: the collective as tensor parallelism
    issues it (DTensor, inside a layer's forward and backward; profiler/hardware/distributed_overhead.py),
    which TP groups use in place of the plain one."""

    collective: Literal["all_reduce", "all_gather", "reduce_scatter", "send_recv", "tp_all_reduce", "tp_all_gather",
                        "tp_reduce_scatter"]
    group_size: int
    ranks: int
    alpha_us: float
    busbw_gb_per_s: float

    def validate(self) -> None:
        require(self.group_size >= 2 and self.ranks >= self.group_size, "group_size",
                "needs 2 <= group_size <= ranks")
        require(self.alpha_us >= 0 and self.busbw_gb_per_s > 0, "busbw_gb_per_s",
                "needs alpha_us >= 0 and busbw_gb_per_s > 0")


@dataclass(frozen=True)
class Cluster:
    name: str
    device: DeviceProfile
    devices_per_node: int
    num_nodes: int
    intra_node: Link
    inter_node: Link
    backend: Literal["nccl", "gloo"] = "nccl"
    source: str = ""
    collective_latency_us: float = 0.0
    """Fixed start-up cost of one collective call, on top of its per-step latency, microseconds."""
    cores_per_node: int = 0
    """CPU cores the ranks of one node share (a CPU host); 0: every device computes on its own (GPUs)."""
    corun_kernel_slowdown: tuple[float, ...] = ()
    """Entry R-1: how much slower a rank's kernel-bound work runs while R ranks compute at once on the
    node, measured by R concurrent one-thread processes timing a small model's forward and backward (with
    a rank's working set; ``autoplan calibrate``, profiler/hardware/corun.py): time-slicing above
    ``cores_per_node``, and below it what co-running ranks still share (SMT siblings, caches, memory
    bandwidth). Empty: max(1, R / cores_per_node)."""
    corun_host_slowdown: tuple[float, ...] = ()
    """The same for host-bound work (chains of tiny eager ops: dispatch, autograd, allocation)."""
    late_receive_us: tuple[float, ...] = ()
    """Entry R-1: the mean wait of a point-to-point receive posted after its send while R ranks compute on
    the node (``autoplan calibrate``, profiler/hardware/distributed_overhead.py): on a CPU host the
    sender's side acts only once the scheduler gives it a core. The cost model lets every pipeline
    receive complete no sooner than this after it is posted (cost/simulate.py). Empty (GPUs): 0."""
    collective_wait_factor: float = 1.0
    """Multiplier on the measured collectives' alpha inside a training step, where ranks reach a collective
    skewed by time-slicing instead of lined up by a barrier as in the microbenchmark. 1.0: the kernel-only
    calibration; only ``autoplan calibrate --runs`` (the optional whole-run refinement) fits it, on the
    runs it names, and reports it apart from the kernel-level fit with its error on held-out runs."""
    collectives: tuple[CollectiveFit, ...] = ()
    """Measured alpha-beta fits per collective, group size and ranks on the node (see the module doc)."""
    residuals: tuple[Residual, ...] = ()
    """Measured collective points against their fits (``autoplan calibrate``)."""

    def validate(self) -> None:
        require(0 < len(self.name) <= 200, "name", "must be 1 to 200 characters")
        require_range(self, "devices_per_node", 1, MAX_DEVICES_PER_NODE)
        require_range(self, "num_nodes", 1, MAX_NODES)
        require(self.num_devices <= MAX_DEVICES, "num_nodes",
                f"{self.num_nodes} x {self.devices_per_node} = {self.num_devices:,} devices; no cluster has more "
                f"than {MAX_DEVICES:,}")
        require_physical(self)  # collective_latency_us in [0, 1e8]
        require(self.backend == "gloo" or self.device.kind == "gpu", "backend",
                f"nccl runs on GPUs and device {self.device.name!r} is a CPU; write backend: gloo")
        require(self.cores_per_node >= 0, "cores_per_node", "must be >= 0 (0: devices do not share cores)")
        require(0.1 <= self.collective_wait_factor <= 100, "collective_wait_factor", "must be in [0.1, 100]")
        for field in ("corun_kernel_slowdown", "corun_host_slowdown"):
            require(all(0.5 <= x <= 1000 for x in getattr(self, field)), field,
                    "each entry is a slow-down factor between 0.5 and 1000 (entry R-1: R ranks at once)")

        require(all(0 <= x <= 1e6 for x in self.late_receive_us), "late_receive_us",
                "each entry is a wait in microseconds between 0 and 1e6 (entry R-1: R ranks on the node)")

    @property
    def shares_cores(self) -> bool:
        """Ranks time-slice the node's cores and their collectives do not overlap compute (a CPU host)."""
        return self.cores_per_node > 0

    def corun_slowdown(self, busy_ranks: float, kind: str) -> float:
        """Slow-down of one rank while ``busy_ranks`` compute at once (``kind`` "kernel" or "host")."""
        table = self.corun_kernel_slowdown if kind == "kernel" else self.corun_host_slowdown
        return corun_slowdown(table, self.cores_per_node, busy_ranks)

    def late_receive_s(self, ranks: int) -> float:
        """A late receive's wait with ``ranks`` on the node (the last measured entry past the table's end)."""
        table = self.late_receive_us
        return table[min(ranks, len(table)) - 1] * 1e-6 if table and ranks >= 1 else 0.0

    def collective_fit(self, collective: str, group_size: int) -> CollectiveFit | None:
        """The measured fit for a group of ``group_size`` while this cluster's ranks run on a node: the fit
        measured at the node's rank count, else at the nearest rank count measured (None: no fit)."""
        mine = [f for f in self.collectives if f.collective == collective and f.group_size == group_size]
        if not mine:
            return None
        ranks = min(self.devices_per_node, self.num_devices)
        return min(mine, key=lambda f: (abs(f.ranks - ranks), -f.ranks))

    @property
    def num_devices(self) -> int:
        return self.devices_per_node * self.num_nodes


def corun_slowdown(table: tuple[float, ...], cores: int, busy_ranks: float) -> float:
    """Slow-down of one rank while ``busy_ranks`` (fractional: interpolated) compute at once on a node of
    ``cores``: the measured table (entry R-1: R ranks) interpolated linearly, past its end by R / cores;
    without a table max(1, R / cores)."""
    cores = max(1, cores)
    if not table:
        return max(1.0, busy_ranks / cores)
    if busy_ranks <= 1:
        return table[0]
    if busy_ranks >= len(table):
        return table[-1] * busy_ranks / len(table)
    lo = int(busy_ranks)
    w = busy_ranks - lo
    return (1 - w) * table[lo - 1] + w * table[lo]
