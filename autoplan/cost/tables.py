"""A configuration's cost table on a cluster: the devices' own terms, then what the cluster's host changes.

The one place the host model is chosen (cost/host_model.py): a cluster whose ranks share the node's
cores (``Cluster.shares_cores``, the CPU test bed) gets ``SharedCoresHost``, every other one the host
that changes nothing. The planner, the estimate and the reports all take their tables from here.
"""

from __future__ import annotations

from autoplan.cost.cpu_host import SharedCoresHost
from autoplan.cost.host_model import DevicesOnTheirOwn, HostModel
from autoplan.cost.stage_table import Config, StageTable, device_table
from autoplan.cost.workload import Workload
from autoplan.schema import Cluster, TrainingSetup

_ON_THEIR_OWN = DevicesOnTheirOwn()


def host_model(cluster: Cluster) -> HostModel:
    """The host the cluster's devices run on."""
    return SharedCoresHost(cluster) if cluster.shares_cores else _ON_THEIR_OWN


def build_table(workload: Workload, cluster: Cluster, training: TrainingSetup, config: Config) -> StageTable:
    """The cost table of ``config`` with per-layer costs ``workload`` on ``cluster``."""
    return host_model(cluster).apply(device_table(workload, cluster, training, config), workload, training)
