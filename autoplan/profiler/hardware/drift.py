"""One calibration, one host speed: each stage's fitted fields put at the calibration's mean speed.

``autoplan calibrate`` measures in stages (kernels, host ops, collectives, co-running) over a few minutes,
and a shared host drifts within that time (runtime/train/speed_probe.py has the figures): the kernels may
be timed in a fast minute and the collectives in a slow one, so the fitted profile describes no single
moment. The fixed probes are timed between the stages; a stage's speed is the geometric mean of the probes
on either side against the mean of all of them, and its fields are divided by it (rates) or multiplied
(times), so that the whole profile describes the host at the speed its probes record
(``probe_gemm_us``, ``probe_op_us``), the speed ``autoplan compare`` measures a run against.

Which stage measured what (calibration_fit.py): kernels: GEMM peak and points, attention points, memory
and host-link bandwidths, AdamW throughput; host ops: per-op, per-view, per-DTensor-module and optimizer
times (the optimizer's per-parameter time at that stage's kernel speed, the rest at its host speed);
collectives: every collective fit, FSDP2 unit and pipeline action times. The co-running table is a ratio
within each session (corun.py) and needs nothing.
"""

from __future__ import annotations

import dataclasses

from autoplan.schema import DeviceProfile
from autoplan.schema.cluster import CollectiveFit
from autoplan.schema.trace import HostSpeed, geometric_mean

STAGES = ("kernels", "host", "distributed", "corun")
"""In the order measured; probe i is timed before stage i, and one more after the last."""
_KERNEL_RATES = ("peak_bf16_tflops", "peak_fp16_tflops", "peak_fp32_tflops", "memory_bandwidth_gb_per_s",
                 "host_link_gb_per_s", "host_adam_gparams_per_s")
_HOST_TIMES = ("host_op_us", "host_view_op_us", "host_backward_op_us", "host_backward_view_op_us",
               "tp_module_fwd_us", "tp_module_bwd_us", "optimizer_tensor_us", "optimizer_dtensor_us")
_HOST_STAGE_KERNEL_TIMES = ("optimizer_ns_per_param",)
"""Measured in the host stage, but kernel work (AdamW's passes over the parameters): that stage's GEMM speed."""
_DISTRIBUTED_TIMES = ("fsdp_unit_fwd_us", "fsdp_unit_bwd_us", "fsdp_hooks_fwd_us", "fsdp_hooks_bwd_us",
                      "pipeline_action_us")


def _mean(probes: list[dict[str, float]], key: str) -> float:
    values = [p[key] for p in probes if p.get(key, 0) > 0]
    return geometric_mean(values) if values else 0.0


def mean_probes(probes: list[dict[str, float]]) -> dict[str, float]:
    """The calibration's probe times, ``probe_gemm_us`` / ``probe_op_us``: geometric means of the probes
    between its stages (0 for raw points saved before the probes existed)."""
    return {"probe_gemm_us": round(_mean(probes, "gemm_us"), 3), "probe_op_us": round(_mean(probes, "op_us"), 3)}


def stage_speeds(probes: list[dict[str, float]]) -> dict[str, HostSpeed] | None:
    """Each stage's speed against the mean of every probe (1.0: as fast as the calibration on average);
    None without one probe per stage boundary (raw points saved before the probes existed)."""
    if len(probes) != len(STAGES) + 1:
        return None
    return {stage: HostSpeed(kernel=_mean(probes, "gemm_us") / _mean(probes[i:i + 2], "gemm_us"),
                             host=_mean(probes, "op_us") / _mean(probes[i:i + 2], "op_us"))
            for i, stage in enumerate(STAGES)}


def at_mean_speed(device: DeviceProfile, fits: list[CollectiveFit],
                  probes: list[dict[str, float]]) -> tuple[DeviceProfile, list[CollectiveFit]]:
    """``device`` and ``fits`` with each stage's fields at the calibration's mean speed (module doc)."""
    speeds = stage_speeds(probes)
    if speeds is None:
        return device, fits
    k = speeds["kernels"].kernel
    h, d = speeds["host"].host, speeds["distributed"]
    fields = {f: getattr(device, f) / k for f in _KERNEL_RATES if getattr(device, f) > 0}
    fields.update({f: getattr(device, f) * h for f in _HOST_TIMES})
    fields.update({f: getattr(device, f) * speeds["host"].kernel for f in _HOST_STAGE_KERNEL_TIMES})
    fields.update({f: getattr(device, f) * d.host for f in _DISTRIBUTED_TIMES})
    device = dataclasses.replace(
        device, **{f: round(v, 6) for f, v in fields.items()},
        matmul_points=tuple(dataclasses.replace(p, tflops=round(p.tflops / k, 7)) for p in device.matmul_points),
        attention_points=tuple(dataclasses.replace(p, tflops=round(p.tflops / k, 7))
                               for p in device.attention_points))
    fits = [dataclasses.replace(c, alpha_us=round(c.alpha_us * d.host, 3),
                                busbw_gb_per_s=round(c.busbw_gb_per_s / d.kernel, 5)) for c in fits]
    return device, fits
