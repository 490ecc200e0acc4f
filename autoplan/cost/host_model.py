"""What the machine around the devices does to a step: the one interface, and its do-nothing implementation.

The general cost model (cost/stage_table.py ``device_table``) prices devices that compute on their own:
a GPU's host queues kernels ahead of it, collectives run on their own engines beside compute, and every
rank computes at its own speed whatever the others do. A host where that is not so changes some of the
table's terms; a ``HostModel`` says which, in two places:

* ``apply``: the configuration's cost table as this host runs it (the device's table in, the host's out);
* ``least_layer_times``: a lower bound on a layer's forward and backward under any configuration of a
  group (the search's group bound, search/bounds.py), which must hold for ``apply``'s times too.

``DevicesOnTheirOwn`` (GPUs) changes nothing. The CPU test bed's host, whose ranks share cores and whose
gloo collectives run on them, is ``SharedCoresHost`` (cost/cpu_host/). ``cost/tables.py`` chooses between
them, in one place; nothing else in the cost model asks which host it runs on.
"""

from __future__ import annotations

from autoplan.cost.stage_table import LayerTimes, StageTable, layer_times
from autoplan.cost.workload import LayerCost, Workload
from autoplan.schema import TrainingSetup


class HostModel:
    """The interface, implemented to change nothing: the host of devices that compute on their own."""

    def apply(self, table: StageTable, workload: Workload, training: TrainingSetup) -> StageTable:
        """The configuration's table on this host (``table``: the devices' own)."""
        return table

    def least_layer_times(self, layer: LayerCost) -> LayerTimes:
        """At most the forward and backward ``apply`` gives ``layer`` under any configuration."""
        return layer_times(layer)


class DevicesOnTheirOwn(HostModel):
    """GPUs: the device's table as it is."""
