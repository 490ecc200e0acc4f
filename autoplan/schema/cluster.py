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

from autoplan.schema._io import require
from autoplan.schema.hardware import DeviceProfile


@dataclass(frozen=True)
class Link:
    bandwidth_gb_per_s: float
    """Achievable bus bandwidth per device, 10^9 bytes/s, one direction."""
    latency_us: float
    """Per-hop (alpha) latency of one ring step, microseconds."""

    def validate(self) -> None:
        require(self.bandwidth_gb_per_s > 0, "bandwidth_gb_per_s", "must be positive")
        require(self.latency_us >= 0, "latency_us", "must be >= 0")


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
        require(self.devices_per_node >= 1, "devices_per_node", "must be at least 1")
        require(self.num_nodes >= 1, "num_nodes", "must be at least 1")
        require(self.collective_latency_us >= 0, "collective_latency_us", "must be >= 0")

    @property
    def num_devices(self) -> int:
        return self.devices_per_node * self.num_nodes
