"""A CPU cluster as it ran: its calibrated fields scaled by the host's speed during a run.

A shared host drifts (runtime/train/speed_probe.py has the figures), and not uniformly: GEMMs and eager
dispatch slow down by different factors. A run times a fixed GEMM and a fixed eager op after every step;
against the same probes timed during the calibration they give a kernel speed and a host speed
(autoplan.schema.trace.HostSpeed). ``at_host_speed`` applies them field by field, so that re-evaluating a
plan on the result (``autoplan compare``) predicts the run at the speed the host actually had:

* kernel speed: every peak (GEMM), the memory and host-link bandwidths, the measured attention points,
  the optimizer's per-parameter time and each collective's bandwidth (copies through memory);
* host speed: every per-op, per-module, per-unit, per-action and per-tensor host time, and each
  collective's and link's latency (gloo's per-call work is the host's: syscalls, wake-ups).

Shapes of the curves (ceilings, half sizes) and the co-running tables are ratios and stay as they are.
Nothing here is fitted: both factors are measured, and on GPUs (no probes) nothing changes.
"""

from __future__ import annotations

import dataclasses

from autoplan.schema import Cluster
from autoplan.schema.trace import HostSpeed

_KERNEL_RATES = ("memory_bandwidth_gb_per_s", "peak_bf16_tflops", "peak_fp16_tflops", "peak_fp32_tflops",
                 "peak_fp8_tflops", "host_link_gb_per_s", "host_adam_gparams_per_s")
_KERNEL_TIMES = ("kernel_overhead_us", "optimizer_ns_per_param")
_HOST_TIMES = ("host_op_us", "host_view_op_us", "host_backward_op_us", "host_backward_view_op_us",
               "tp_module_fwd_us", "tp_module_bwd_us", "fsdp_unit_fwd_us", "fsdp_unit_bwd_us",
               "fsdp_hooks_fwd_us", "fsdp_hooks_bwd_us", "pipeline_action_us", "optimizer_tensor_us",
               "optimizer_dtensor_us")


def at_host_speed(cluster: Cluster, speed: HostSpeed) -> Cluster:
    """``cluster`` with its device and collectives at ``speed`` (see the module doc)."""
    d = cluster.device
    k, h = speed.kernel, speed.host
    fields = {f: getattr(d, f) * k for f in _KERNEL_RATES}
    fields.update({f: getattr(d, f) / k for f in _KERNEL_TIMES})
    fields.update({f: getattr(d, f) / h for f in _HOST_TIMES})
    device = dataclasses.replace(
        d, **fields, attention_points=tuple(dataclasses.replace(p, tflops=p.tflops * k) for p in d.attention_points))
    links = {name: dataclasses.replace(link, bandwidth_gb_per_s=link.bandwidth_gb_per_s * k,
                                       latency_us=link.latency_us / h)
             for name, link in (("intra_node", cluster.intra_node), ("inter_node", cluster.inter_node))}
    collectives = tuple(dataclasses.replace(c, alpha_us=c.alpha_us / h, busbw_gb_per_s=c.busbw_gb_per_s * k)
                        for c in cluster.collectives)
    return dataclasses.replace(cluster, device=device, collectives=collectives,
                               collective_latency_us=cluster.collective_latency_us / h, **links)
