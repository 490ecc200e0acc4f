"""The CPU test bed's host model: ranks sharing a node's cores, gloo collectives on those cores, speed probes.

``SharedCoresHost`` (model.py) is the ``HostModel`` (cost/host_model.py) of a cluster whose ranks share its
cores; terms.py and shared_cores.py price what it changes; host_speed.py re-evaluates a plan at the speed
a run's probes measured. Only cost/tables.py chooses it.
"""

from autoplan.cost.cpu_host.model import SharedCoresHost

__all__ = ["SharedCoresHost"]
