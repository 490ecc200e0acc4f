"""The terms a CPU host adds to a step, where ranks share cores and gloo's collectives cannot overlap.

Each is zero on a cluster whose devices compute on their own (``Cluster.shares_cores`` false, GPUs), so
GPU predictions do not move. On a CPU host (``cores_per_node`` > 0):

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
  every forward and backward, the rest with each gather and each reduce-scatter. Measured on the 2-core
  host: 9 FSDP2 units of 16 x 16 layers at 2 ranks took 0.60 ms a forward that did not gather (hooks
  alone, against 0.05 plain) and 5.8 ms one that did; charging every ZeRO-1/2 micro-batch the whole unit
  cost overpredicted llama-tiny's dp4 ZeRO-1 plan by 23%.
* The runtime's own small collectives once per step (``step_sync_s``): the gradient norm's all-reduce over
  all ranks, the loss's all-reduces over pp and dp, and the tied embedding's gradient between the first
  and the last pipeline rank. Counted where the cluster has measured fits (on NCCL at scale the ring
  formula overstates small-message latency, where NCCL switches to tree and LL protocols).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from autoplan.cost.comm import collective_time_s, group_link
from autoplan.cost.shared_cores import shared_span
from autoplan.cost.simulate import simulate
from autoplan.schema import Cluster
from autoplan.schema.cluster import corun_slowdown
from autoplan.schema.plan import ParallelConfig as Config
from autoplan.schema.schedule import build_schedule


@dataclass(frozen=True)
class CoreShare:
    """Slow-down factors from time-slicing: ``pipeline`` for forward/backward work, ``tail`` for the end of
    the step (1.0 where devices do not share cores)."""

    pipeline: float = 1.0
    host: float = 1.0
    """The same for host (framework) time during the pipeline phase."""
    tail: float = 1.0

    def scaled_s(self, total_s: float, host_s: float) -> float:
        """A layer time of which ``host_s`` is host time, stretched by the pipeline-phase factors."""
        return (total_s - host_s) * self.pipeline + host_s * self.host


def ranks_on_node(cluster: Cluster, config: Config) -> int:
    return min(cluster.devices_per_node, config.tp * config.cp * config.pp * config.dp)


def core_share(cluster: Cluster, config: Config) -> CoreShare:
    """Slow-downs of co-running ranks, for the pipeline phase (kernel, host) and the end of the step."""
    if not cluster.shares_cores:
        return CoreShare()
    ranks = ranks_on_node(cluster, config)
    if config.num_stages == 1:  # every rank computes all the time
        pipeline, host = cluster.corun_slowdown(ranks, "kernel"), cluster.corun_slowdown(ranks, "host")
    else:
        pipeline, host = (_pipeline_slowdown(config.schedule, config.pp, config.virtual_stages,
                                             config.num_microbatches, _pipeline_nodes(cluster, config),
                                             min(config.tp * config.cp * config.dp, cluster.devices_per_node),
                                             table, cluster.cores_per_node)
                          for table in (cluster.corun_kernel_slowdown, cluster.corun_host_slowdown))
    return CoreShare(pipeline=pipeline, host=host, tail=cluster.corun_slowdown(ranks, "kernel"))


def _pipeline_nodes(cluster: Cluster, config: Config) -> tuple[int, ...]:
    """The node of each pipeline rank: global rank tp x cp x dp x r of its first replica (plan.py order)."""
    return tuple(config.tp * config.cp * config.dp * r // cluster.devices_per_node for r in range(config.pp))


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
    ZeRO-0 has no per-unit collectives (replicate: ``replicate_step_s``)."""
    c = config
    if not cluster.shares_cores or c.dp_cp == 1 or c.zero_stage == 0 or params <= 0:
        return FsdpLayer()
    link = group_link(cluster, c.dp_cp, c.tp)
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
    if not cluster.shares_cores or config.dp_cp == 1 or config.zero_stage != 0:
        return 0.0, 0.0
    d = cluster.device
    return d.fsdp_unit_fwd_us * 1e-6 * share, d.fsdp_unit_bwd_us * 1e-6 * share


def step_sync_s(cluster: Cluster, config: Config, tied_grad_bytes: float) -> tuple[float, float]:
    """(every rank, first and last pipeline rank only): the runtime's per-step small all-reduces."""
    if not cluster.collectives:
        return 0.0, 0.0
    c = config
    world = c.tp * c.cp * c.pp * c.dp
    scalar = 4.0  # one fp32 value
    every = collective_time_s("all_reduce", scalar, group_link(cluster, world, 1))
    if c.pp > 1:
        every += collective_time_s("all_reduce", scalar, group_link(cluster, c.pp, c.tp * c.cp * c.dp))
    if c.dp_cp > 1:
        every += collective_time_s("all_reduce", scalar, group_link(cluster, c.dp_cp, c.tp))
    ends = collective_time_s("all_reduce", tied_grad_bytes, group_link(cluster, 2, c.tp * c.cp * c.dp * (c.pp - 1))) \
        if c.pp > 1 and tied_grad_bytes > 0 else 0.0
    return every, ends


def optimizer_tensor_s(cluster: Cluster, config: Config, tensors: int, tp_tensors: int, share: float) -> float:
    """Per-tensor host time of one layer's optimizer step: every tensor is a DTensor under FSDP2 or
    replicate (dp > 1), the TP-sharded ones under TP."""
    d = cluster.device
    dtensors = tensors if config.dp_cp > 1 else (tp_tensors if config.tp > 1 else 0)
    return ((tensors - dtensors) * d.optimizer_tensor_us + dtensors * d.optimizer_dtensor_us) * 1e-6 * share
