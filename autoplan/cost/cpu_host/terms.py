"""The terms a CPU host adds to a step, where ranks share cores and gloo's collectives cannot overlap.

Only the CPU host model (cost/cpu_host/model.py) calls these, for a cluster whose ranks share the node's
cores (``Cluster.shares_cores``); devices that compute on their own never see them. On a CPU host:

* Shared cores (``core_share``). R ranks busy at once on C cores each get min(1, C / R) of a core
  (the scheduler time-slices them fairly), so every compute and host time is multiplied by
  max(1, R / C); a calibrated cluster replaces that by its measured co-running slow-downs
  (``Cluster.corun_kernel_slowdown`` for kernel time, ``corun_host_slowdown`` for host time), which also
  hold what ranks share below the core count (SMT siblings, caches, memory bandwidth). Within the
  pipeline R changes as ranks block in gloo for a transfer (freeing their cores) and resume: the factor
  is the schedule's own action lists run on shared cores (cost/shared_cores.py, processor sharing at the
  measured slow-downs) over the same lists on cores of their own, both with uniform stages (forward 1,
  backward 2), so it depends on the configuration only and every layout of it shares one factor (the
  search stays exact). The end of the step (the optimizer) runs on all ranks at once: the kernel
  slow-down at all the node's ranks.
* FSDP2's collectives where the runtime issues them (runtime/parallel/data_parallel.py), each with its
  measured latency (``fsdp_layer_s``, ``fsdp_step_s``): one unit per block and the stage root (embedding,
  head). Without pipelining, ZeRO-3 all-gathers a unit's weights for its forward and again for its
  backward and reduce-scatters its gradients every micro-batch; ZeRO-2 gathers once per step and
  reduce-scatters every micro-batch; ZeRO-1 gathers and reduce-scatters once per step; ZeRO-0
  (``replicate``) all-reduces the stage's gradients once per step, one collective. Under pipelining
  torch's schedule runtime gathers each stage once (UNSHARD) and reduce-scatters once after the stage's
  last backward (REDUCE_GRAD); ZeRO-3 still regathers for every forward and backward. Each gather and
  scatter also copies its buffer in and out (2 x the unit's bytes, memory-bound). FSDP2's host work per
  unit (``fsdp_unit_fwd_us`` / ``fsdp_unit_bwd_us``, measured on ZeRO-3 units, which gather and reduce
  every time) is paid where the work happens: its hooks (``fsdp_hooks_fwd_us`` / ``fsdp_hooks_bwd_us``)
  every forward and backward, the rest with each gather and each reduce-scatter. A ZeRO-1/2 forward that
  does not gather pays the hooks alone: charging it the whole unit cost would over-price every
  micro-batch after the first.
* The optimizer's per-tensor host work (``optimizer_tensor_s``): every parameter tensor is stepped one by
  one, a DTensor one through DTensor's dispatch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from autoplan.cost.comm import collective_time_s, group_link
from autoplan.cost.cpu_host.shared_cores import shared_span
from autoplan.cost.simulate import simulate
from autoplan.cost.stage_table import CoreShare
from autoplan.schema import Cluster
from autoplan.schema.cluster import corun_slowdown
from autoplan.schema.plan import ParallelConfig as Config
from autoplan.schema.schedule import build_schedule


def core_share(cluster: Cluster, config: Config) -> CoreShare:
    """Slow-downs of co-running ranks, for the pipeline phase (kernel, host) and the end of the step."""
    dims = config.dims
    ranks = dims.ranks_on_node(cluster.devices_per_node)
    if config.num_stages == 1:  # every rank computes all the time
        pipeline, host = cluster.corun_slowdown(ranks, "kernel"), cluster.corun_slowdown(ranks, "host")
    else:
        pipeline, host = (_pipeline_slowdown(config.schedule, config.pp, config.virtual_stages,
                                             config.num_microbatches, dims.pipeline_nodes(cluster.devices_per_node),
                                             min(dims.stage_ranks, cluster.devices_per_node),
                                             table, cluster.cores_per_node)
                          for table in (cluster.corun_kernel_slowdown, cluster.corun_host_slowdown))
    return CoreShare(pipeline=pipeline, host=host, tail=cluster.corun_slowdown(ranks, "kernel"))


@functools.lru_cache(maxsize=1024)
def _pipeline_slowdown(schedule: str, pp: int, v: int, m: int, nodes: tuple[int, ...], replicas: int,
                       table: tuple[float, ...], cores: int) -> float:
    """Uniform stages' step on shared cores over their step on cores of their own."""
    stages = pp * v
    orders = build_schedule(schedule, pp, v, m)
    fwd, bwd, p2p = [1.0] * stages, [2.0] * stages, [0.0] * (stages - 1)
    alone = max(simulate(orders, fwd, bwd, p2p).rank_end.values())
    return shared_span(orders, fwd, bwd, p2p, lambda busy: corun_slowdown(table, cores, busy), nodes,
                       replicas) / alone


@dataclass(frozen=True)
class FsdpLayer:
    """One FSDP2 unit's costs per micro-batch (added to its forward and backward) and per step."""

    fwd_s: float = 0.0
    bwd_s: float = 0.0
    gather_step_s: float = 0.0
    """All-gathers once per step (ZeRO-1/2, and under pipelining the stage's UNSHARD)."""
    reduce_step_s: float = 0.0
    """Reduce-scatters once per step (ZeRO-1, and under pipelining REDUCE_GRAD)."""


def fsdp_layer(cluster: Cluster, config: Config, params: float, weight_bytes: int, share: float) -> FsdpLayer:
    """Costs of one unit holding ``params`` parameters on a host that shares its cores (see the module doc).
    ZeRO-0 has no per-unit collectives (replicate: ``replicate_microbatch_s``)."""
    c = config
    if c.dp_cp == 1 or c.zero_stage == 0 or params <= 0:
        return FsdpLayer()
    link = group_link(cluster, c.dims.span("dp_cp"))
    size = params * weight_bytes
    device = cluster.device
    copy_s = 2 * size / (device.memory_bandwidth_gb_per_s * 1e9 * device.memory_efficiency) * share
    # FSDP2's host work splits into its hooks (every forward and backward) and the work of gathering and
    # of reducing (only where a unit gathers or reduce-scatters): a ZeRO-3 backward regathers and reduces
    hooks_fwd, hooks_bwd = device.fsdp_hooks_fwd_us * 1e-6 * share, device.fsdp_hooks_bwd_us * 1e-6 * share
    gather_host = max(0.0, device.fsdp_unit_fwd_us - device.fsdp_hooks_fwd_us) * 1e-6 * share
    scatter_host = max(0.0, device.fsdp_unit_bwd_us - device.fsdp_hooks_bwd_us) * 1e-6 * share - gather_host
    gather = collective_time_s("all_gather", size, link) + copy_s + gather_host
    scatter = collective_time_s("reduce_scatter", size, link) + copy_s + max(0.0, scatter_host)
    pipelined = c.num_stages > 1
    if c.zero_stage == 3:
        return FsdpLayer(fwd_s=hooks_fwd + gather, bwd_s=hooks_bwd + gather + (0.0 if pipelined else scatter),
                         reduce_step_s=scatter if pipelined else 0.0)
    every_microbatch = c.zero_stage == 2 and not pipelined
    return FsdpLayer(fwd_s=hooks_fwd, bwd_s=hooks_bwd + (scatter if every_microbatch else 0.0),
                     gather_step_s=gather, reduce_step_s=0.0 if every_microbatch else scatter)


def replicate_microbatch_s(cluster: Cluster, config: Config, share: float) -> tuple[float, float]:
    """ZeRO-0 with dp > 1 on a shared host: the replicate root's hooks, once per stage and micro-batch."""
    if config.dp_cp == 1 or config.zero_stage != 0:
        return 0.0, 0.0
    d = cluster.device
    return d.fsdp_unit_fwd_us * 1e-6 * share, d.fsdp_unit_bwd_us * 1e-6 * share


def optimizer_tensor_s(cluster: Cluster, config: Config, tensors: int, tp_tensors: int, share: float) -> float:
    """Per-tensor host time of one layer's optimizer step: every tensor is a DTensor under FSDP2 or
    replicate (dp > 1), the TP-sharded ones under TP."""
    d = cluster.device
    dtensors = tensors if config.dp_cp > 1 else (tp_tensors if config.tp > 1 else 0)
    return ((tensors - dtensors) * d.optimizer_tensor_us + dtensors * d.optimizer_dtensor_us) * 1e-6 * share
