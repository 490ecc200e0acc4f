"""A cluster: identical nodes of identical devices, one link inside a node and one between nodes.

Link bandwidths are *achievable bus bandwidth per device* (what nccl-tests reports as busbw for large
messages), not line rates, so the collective formulas need no further efficiency factor. A collective
costs ``collective_latency_us`` once plus ``latency_us`` per ring step (NCCL's own cost model, its
``baseLat`` and ``hwLat`` in src/graph/tuning.cc), plus its bytes over the bus bandwidth. Ranks are laid
out node by node: global rank = node * devices_per_node + local rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autoplan.schema._io import require, require_physical, require_range
from autoplan.schema.hardware import DeviceProfile
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

    def validate(self) -> None:
        require(0 < len(self.name) <= 200, "name", "must be 1 to 200 characters")
        require_range(self, "devices_per_node", 1, MAX_DEVICES_PER_NODE)
        require_range(self, "num_nodes", 1, MAX_NODES)
        require(self.num_devices <= MAX_DEVICES, "num_nodes",
                f"{self.num_nodes} x {self.devices_per_node} = {self.num_devices:,} devices; no cluster has more "
                f"than {MAX_DEVICES:,}")
        require_physical(self)  # collective_latency_us in [0, 1e8]

    @property
    def num_devices(self) -> int:
        return self.devices_per_node * self.num_nodes
