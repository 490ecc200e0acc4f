"""Measure this machine and build the DeviceProfile and Cluster that ``autoplan plan --cluster`` reads.

What is a "device" here: on CUDA one GPU; on CPU one rank of ``nproc`` that share the host, so compute
is timed with cores/nproc threads and memory is the available RAM divided by nproc.

Peaks: a device profile pairs datasheet peaks with efficiency factors. ``peak_from`` (a shipped device
name or file) supplies stated peaks and memory bandwidth, and the fit gives the efficiencies against them;
on CUDA the shipped profile whose name matches the GPU is used by default. Without a stated peak (a CPU)
the peak is the fitted matmul asymptote (ceiling 1.0) and the memory peak is the measured copy bandwidth,
against which element-wise kernels give memory_efficiency. ``source`` records which.
"""

from __future__ import annotations

import os
import re
import sys
from collections import defaultdict
from dataclasses import dataclass

import torch

from autoplan.profiler.hardware import compute
from autoplan.profiler.hardware.collectives import measure_collectives
from autoplan.profiler.hardware.fit import AlphaBeta, fit_alpha_beta, fit_matmul
from autoplan.schema import Cluster, DeviceProfile, Link
from autoplan.schema.io import load_device, shipped_names

CPU_SIZES, GPU_SIZES = [32, 64, 128, 256, 512, 1024], [512, 1024, 2048, 4096, 8192]
CPU_MESSAGES = [2**k for k in range(10, 24, 2)]  # 1 KiB .. 4 MiB
GPU_MESSAGES = [2**k for k in range(10, 29, 2)]  # 1 KiB .. 256 MiB


@dataclass(frozen=True)
class HardwareProfile:
    device: DeviceProfile
    cluster: Cluster
    fits: tuple[AlphaBeta, ...]


def profile_hardware(nproc: int, name: str | None = None, peak_from: str | None = None,
                     progress: bool = True) -> HardwareProfile:
    say = (lambda m: print(m, file=sys.stderr)) if progress else (lambda m: None)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    stated = _stated_peaks(device, peak_from)
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    try:
        profile = _device_profile(device, nproc, name, stated, say)
    finally:
        torch.set_num_threads(threads)
    fits: list[AlphaBeta] = []
    if nproc >= 2:
        say(f"collectives: {nproc} spawned ranks, group sizes 2..{nproc}")
        raw = measure_collectives(nproc, GPU_MESSAGES if device.type == "cuda" else CPU_MESSAGES)
        fits = _fit_collectives(raw["points"])
        backend = raw["backend"]
    else:
        backend = "nccl" if device.type == "cuda" else "gloo"
    cluster = _cluster(profile, nproc, fits, backend)
    return HardwareProfile(profile, cluster, tuple(fits))


def _stated_peaks(device: torch.device, peak_from: str | None) -> DeviceProfile | None:
    if peak_from:
        return load_device(peak_from)
    if device.type != "cuda":
        return None
    gpu = re.sub(r"[^a-z0-9]", "", torch.cuda.get_device_name().lower())  # "nvidiah200" ...
    for shipped in shipped_names("hardware"):
        model = shipped.split("-")[0]  # "h200-sxm-141gb" -> "h200"
        if model and model in gpu:
            return load_device(shipped)
    return None


def _device_profile(device: torch.device, nproc: int, name: str | None, stated: DeviceProfile | None,
                    say) -> DeviceProfile:
    dtypes = [torch.float32, torch.bfloat16] + ([torch.float16] if device.type == "cuda" else [])
    points = compute.matmul_points(device, dtypes, GPU_SIZES if device.type == "cuda" else CPU_SIZES, say)
    fits = {}
    for dtype in ("fp32", "bf16", "fp16"):
        mine = [p for p in points if p.dtype == dtype]
        if mine:
            peak = stated.peak_tflops(dtype) if stated else None
            fits[dtype] = fit_matmul([2 * p.m * p.n * p.k / 1e9 for p in mine], [p.tflops for p in mine], peak)
    fits.setdefault("fp16", fits["bf16"])  # CPU: fp16 GEMMs are not faster than bf16; not measured
    main = "bf16" if device.type == "cuda" else "fp32"  # the precision the planner mostly uses there
    buffer = 256 * 2**20 if device.type == "cuda" else 64 * 2**20
    copy_bw = compute.copy_bandwidth_gb_per_s(device, buffer)
    elementwise_bw = compute.elementwise_bandwidth_gb_per_s(device, buffer)
    peak_bw = stated.memory_bandwidth_gb_per_s if stated else copy_bw
    say(f"memory: copy {copy_bw:.1f} GB/s, element-wise {elementwise_bw:.1f} GB/s")
    source = (f"autoplan profile-hardware --nproc {nproc} on {_describe(device)}; torch {torch.__version__}; "
              + (f"peaks stated by {stated.name}" if stated else
                 "no stated peak: peaks = fitted matmul asymptotes (ceiling 1.0), memory peak = measured copy bandwidth"))
    return DeviceProfile(
        name=name or _default_name(device, nproc),
        kind="gpu" if device.type == "cuda" else "cpu",
        memory_gib=round(_memory_gib(device, nproc), 2),
        memory_bandwidth_gb_per_s=round(peak_bw, 3),
        peak_bf16_tflops=round(fits["bf16"].peak_tflops, 6),
        peak_fp16_tflops=round(fits["fp16"].peak_tflops, 6),
        peak_fp32_tflops=round(fits["fp32"].peak_tflops, 6),
        matmul_efficiency=round(fits[main].ceiling, 4),
        matmul_half_size_gflop=round(fits[main].half_size_gflop, 6),
        memory_efficiency=round(min(1.0, elementwise_bw / peak_bw), 4),
        kernel_overhead_us=round(compute.kernel_overhead_us(device), 2),
        host_link_gb_per_s=round(compute.host_link_gb_per_s(device), 3),
        host_adam_gparams_per_s=round(compute.host_adam_gparams_per_s(), 4),
        source=source,
        matmul_points=tuple(points),
    )


def _fit_collectives(points: list[dict]) -> list[AlphaBeta]:
    groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for p in points:
        groups[(p["collective"], p["group_size"])].append(p)
    return [fit_alpha_beta(kind, n, [p["bytes"] for p in ps], [p["seconds"] for p in ps])
            for (kind, n), ps in groups.items()]


def _cluster(device: DeviceProfile, nproc: int, fits: list[AlphaBeta], backend: str) -> Cluster:
    """One node of ``nproc`` devices. The link is the all-reduce fit of the largest group (what TP and DP
    mostly run); the inter-node link is unknown from one machine and set equal to it."""
    if fits:
        largest = max(f.group_size for f in fits)
        ar = next(f for f in fits if f.collective == "all_reduce" and f.group_size == largest)
        link = Link(bandwidth_gb_per_s=round(ar.busbw_gb_per_s, 4), latency_us=round(ar.latency_us, 2))
    else:
        link = Link(bandwidth_gb_per_s=device.memory_bandwidth_gb_per_s, latency_us=0.0)
    return Cluster(name=f"{device.name}-x{nproc}", device=device, devices_per_node=nproc, num_nodes=1,
                   intra_node=link, inter_node=link, backend=backend,
                   source=f"autoplan profile-hardware --nproc {nproc} ({backend}); "
                          "inter_node not measured (one machine), set equal to intra_node")


def _describe(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name()
    from autoplan.profiler.model_profile import cpu_model_name
    return f"{cpu_model_name()} ({os.cpu_count()} cores)"


def _default_name(device: torch.device, nproc: int) -> str:
    if device.type == "cuda":
        return "measured-" + re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")
    return f"measured-cpu-rank-of-{nproc}"


def _memory_gib(device: torch.device, nproc: int) -> float:
    if device.type == "cuda":
        return torch.cuda.mem_get_info()[1] / 2**30
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) for line in f}
    return info.get("MemAvailable", info["MemTotal"]) * 1024 / 2**30 / nproc


def fits_table(fits: tuple[AlphaBeta, ...]) -> list[str]:
    """The fits as YAML comment lines (kept in the cluster file, which has no field for them)."""
    lines = ["# measured alpha-beta fits: collective, group size, alpha (us), bus bandwidth (GB/s), per-hop latency (us)"]
    for f in sorted(fits, key=lambda f: (f.collective, f.group_size)):
        lines.append(f"#   {f.collective:<15}n={f.group_size}  alpha {f.alpha_us:9.1f}  busbw {f.busbw_gb_per_s:8.3f}"
                     f"  hop {f.latency_us:8.1f}")
    return lines
