"""A configuration's cost table on a cluster: the devices' own terms, then what the cluster's host changes.

The one place the host model is chosen (cost/host_model.py): a cluster whose ranks share the node's
cores (``Cluster.shares_cores``, the CPU test bed) gets ``SharedCoresHost``, every other one the host
that changes nothing. The planner, the estimate and the reports all take their tables from here.
"""

from __future__ import annotations

import dataclasses

from autoplan.cost.cpu_host import SharedCoresHost
from autoplan.cost.host_model import DevicesOnTheirOwn, HostModel
from autoplan.cost.stage_table import Config, LayerTimes, StageTable, device_table, ns
from autoplan.cost.workload import LayerCost, Workload, with_exposed_exchange
from autoplan.schema import Cluster, TrainingSetup

_ON_THEIR_OWN = DevicesOnTheirOwn()


def host_model(cluster: Cluster) -> HostModel:
    """The host the cluster's devices run on."""
    return SharedCoresHost(cluster) if cluster.shares_cores else _ON_THEIR_OWN


def build_table(workload: Workload, cluster: Cluster, training: TrainingSetup, config: Config,
                dense_full: bool = False) -> StageTable:
    """The cost table of ``config`` with per-layer costs ``workload`` on ``cluster``; ``dense_full``: a MoE
    model's leading dense blocks fully recomputed (cost/stage_table.py)."""
    workload = with_exposed_exchange(workload, config)
    host = host_model(cluster)
    table = host.apply(device_table(workload, cluster, training, config, dense_full), workload, training)
    if host is _ON_THEIR_OWN or not (workload.dense_layers or _has_all_to_all(workload)):
        return table
    return _moe_on_host(table, host, workload, cluster, training, config)


def _has_all_to_all(w: Workload) -> bool:
    return any(layer.ep_fwd_s or layer.ep_bwd_s for layer in (w.embedding, w.block, w.head))


def _moe_on_host(t: StageTable, host: HostModel, w: Workload, cluster: Cluster, training: TrainingSetup,
                 config: Config) -> StageTable:
    """What a host that re-prices layers (cost/cpu_host/) leaves out of a MoE table, put back: the experts'
    all-to-all on each layer's critical path and in a recomputed block's rerun (stage_table.layer_times), and
    the leading dense blocks priced by the same host as a block of their own. (The host's FSDP units still
    treat expert parameters like the others, over dp x cp, not edp; its optimizer shards do not.)"""
    def plus(times: LayerTimes, layer: LayerCost) -> LayerTimes:
        fwd, bwd = times.fwd_ns + ns(layer.ep_fwd_s), times.bwd_ns + ns(layer.ep_bwd_s)
        return LayerTimes(fwd, bwd, min(bwd, times.wgt_ns))

    rerun = ns(w.block.ep_fwd_s)
    changes = dict(block=plus(t.block, w.block), embedding=plus(t.embedding, w.embedding), head=plus(t.head, w.head),
                   full_extra_ns=t.full_extra_ns + rerun,
                   full_extra_weight_ns=t.full_extra_weight_ns
                   + (w.block.weight_groups * rerun if t.split_backward else 0))
    k = w.dense_layers
    if k:
        alone = dataclasses.replace(w, block=w.dense_block, num_layers=w.num_layers - k, dense_layers=0,
                                    dense_block=None)
        d = host.apply(device_table(alone, cluster, training, config), alone, training)
        dense = plus(d.block, w.dense_block)
        if t.dense_full:  # the host's own price of a recomputed block, as for the MoE blocks
            rerun = d.full_extra_ns + ns(w.dense_block.ep_fwd_s)
            weight = w.dense_block.weight_groups * rerun if t.split_backward else 0
            dense = LayerTimes(dense.fwd_ns, dense.bwd_ns + rerun + weight, dense.wgt_ns + weight)
        changes.update(dense=LayerTimes(k * dense.fwd_ns, k * dense.bwd_ns, k * dense.wgt_ns),
                       dense_sync_ns=k * d.sync_block_ns, dense_gather_ns=k * d.gather_block_ns,
                       dense_optim_ns=k * d.optim_block_ns)
    return dataclasses.replace(t, **changes)
