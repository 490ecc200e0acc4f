"""``autoplan calibrate``: run the kernel- and op-level microbenchmarks of a CPU host and build the device
profile and the cluster file from their fits (calibration_fit.py).

What runs, in order (progress on stderr): GEMMs, attention and element-wise kernels on one thread of
this process (kernels.py); the host time of eager ops, DTensor modules, the optimizer and the memory
baseline in one spawned process of one rank (host_overhead.py); collectives for worlds of 2..nproc
ranks, FSDP2 units and pipeline actions in spawned gloo worlds (distributed_overhead.py). The raw points
can be saved and refitted without measuring again (``--raw-out``, ``--from-raw``).

A CPU rank of ``autoplan run`` computes on one thread; while more ranks compute than the machine has
cores, they share them (``Cluster.cores_per_node``, cost/host_terms.py), which is why each kernel is
measured alone on one thread and the cores are counted, not measured under contention.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable

from autoplan.profiler.hardware.calibration_fit import fit_collectives, fit_device
from autoplan.profiler.hardware.drift import at_mean_speed, mean_probes
from autoplan.profiler.hardware.fit import ring_hops
from autoplan.schema import Cluster, DeviceProfile, Link


def machine_cores() -> int:
    """Cores this process may run on (its affinity mask), what the ranks of one run share."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def measure_raw(nproc: int, say: Callable[[str], None], repeats: int = 7) -> dict:
    """Every raw point ``fit_device`` and ``fit_collectives`` need, as plain data (JSON-able)."""
    import dataclasses

    import torch

    from autoplan.profiler.hardware import compute, kernels
    from autoplan.profiler.hardware.distributed_overhead import measure_distributed
    from autoplan.profiler.hardware.host_overhead import measure_host_overhead

    from runtime.train.speed_probe import probe as speed_probe

    def probe() -> None:  # the host's speed at each stage: runs are judged at the speed they ran
        probes.append(speed_probe(repeats=15))

    probes: list[dict[str, float]] = []
    probe()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        say("kernels: GEMMs (fp32, one thread)")
        gemms = [dataclasses.asdict(p) for p in kernels.gemm_points()]
        say("kernels: attention (SDPA, causal) over sequence length and head size, forward and backward")
        attention = kernels.attention_points()
        say("kernels: element-wise bandwidth")
        elementwise = kernels.elementwise_points()
        cpu = torch.device("cpu")
        host_link = compute.host_link_gb_per_s(cpu, 64 * 2**20)
        host_adam = compute.host_adam_gparams_per_s()
    finally:
        torch.set_num_threads(threads)
    probe()
    say("host: eager ops and views, DTensor modules, optimizer, process memory baseline (one spawned rank)")
    host = measure_host_overhead()
    probe()
    distributed = measure_distributed(nproc, repeats, say) if nproc >= 2 else {"collectives": []}
    probe()
    from autoplan.profiler.hardware.corun import measure_corun
    corun = measure_corun(nproc, say=say)
    probe()
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) for line in f}
    return {"nproc": nproc, "cores": machine_cores(), "machine": platform.processor() or platform.machine(),
            "torch": torch.__version__, "memory_available_bytes": info.get("MemAvailable", info["MemTotal"]) * 1024,
            "host_link_gb_per_s": host_link, "host_adam_gparams_per_s": host_adam,
            "gemms": gemms, "attention": attention, "elementwise": elementwise, "host": host,
            "distributed": distributed, "corun": corun,
            "speed_probes": probes}


def build_profiles(raw: dict, device_name: str, cluster_name: str) -> tuple[DeviceProfile, Cluster]:
    """The device profile and the cluster (device embedded) fitted from ``raw``."""
    nproc, cores = raw["nproc"], raw["cores"]
    fit = fit_device(raw)
    f = fit.fields
    peak = f["peak_fp32_tflops"]
    device = DeviceProfile(
        name=device_name, kind="cpu",
        memory_gib=round(raw["memory_available_bytes"] / 2**30 / max(1, nproc), 2),
        memory_bandwidth_gb_per_s=f["memory_bandwidth_gb_per_s"],
        peak_bf16_tflops=peak, peak_fp16_tflops=peak, peak_fp32_tflops=peak,
        matmul_efficiency=f["matmul_efficiency"], matmul_half_size_gflop=f["matmul_half_size_gflop"],
        memory_efficiency=f["memory_efficiency"], kernel_overhead_us=f["kernel_overhead_us"],
        host_link_gb_per_s=round(raw["host_link_gb_per_s"], 3),
        host_adam_gparams_per_s=round(raw["host_adam_gparams_per_s"], 4),
        **{k: f[k] for k in ("host_op_us", "host_view_op_us", "host_backward_op_us", "host_backward_view_op_us",
                             "tp_module_fwd_us", "tp_module_bwd_us", "fsdp_unit_fwd_us", "fsdp_unit_bwd_us",
                             "fsdp_hooks_fwd_us", "fsdp_hooks_bwd_us", "pipeline_action_us", "optimizer_tensor_us",
                             "optimizer_dtensor_us",
                             "optimizer_ns_per_param", "memory_baseline_gib") if k in f},
        source=(f"autoplan calibrate --nproc {nproc} on {raw['machine']} ({cores} cores), torch {raw['torch']}: "
                "one rank's thread; kernel and op microbenchmarks only (autoplan/profiler/hardware/calibrate.py); "
                "bf16/fp16 peaks not measured (set to fp32: the CPU runs plans in fp32)"),
        **mean_probes(raw.get("speed_probes", [])),
        matmul_points=fit.matmul_points, attention_points=fit.attention_points, residuals=fit.residuals,
    )
    fits, residuals = fit_collectives(raw["distributed"]["collectives"])
    device, fits = at_mean_speed(device, fits, raw.get("speed_probes", []))  # one speed for every stage
    device.validate()
    mine = [c for c in fits if c.collective == "all_reduce" and c.ranks == nproc]
    if mine:  # the link formula, for group sizes with no fit: the largest all-reduce group's per-hop figures
        ar = max(mine, key=lambda c: c.group_size)
        link = Link(bandwidth_gb_per_s=ar.busbw_gb_per_s,
                    latency_us=round(ar.alpha_us / ring_hops("all_reduce", ar.group_size), 3))
    else:
        link = Link(bandwidth_gb_per_s=device.memory_bandwidth_gb_per_s, latency_us=0.0)
    corun = raw.get("corun", {})
    slowdown = {k: tuple(round(t / v[0], 4) for t in v) for k, v in corun.items() if v}
    kernel_slowdown = slowdown.get("layer", slowdown.get("gemm", ()))  # "gemm": raw files from before "layer"
    late = {p["ranks"]: p["seconds"] for p in raw["distributed"].get("late_receive", ())}
    late_receive = tuple(round(late.get(r, 0.0) * 1e6, 3) for r in range(1, nproc + 1)) if late else ()
    cluster = Cluster(name=cluster_name, device=device, devices_per_node=nproc, num_nodes=1, intra_node=link,
                      inter_node=link, backend="gloo", cores_per_node=cores, collectives=fits, residuals=residuals,
                      corun_kernel_slowdown=kernel_slowdown, corun_host_slowdown=slowdown.get("ops", ()),
                      late_receive_us=late_receive,
                      source=f"autoplan calibrate --nproc {nproc}: gloo over loopback, {cores} cores shared by "
                             "the ranks; inter_node not measured (one machine), set equal to intra_node")
    cluster.validate()
    return device, cluster
