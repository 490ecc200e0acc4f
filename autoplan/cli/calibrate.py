"""``autoplan calibrate``: fit this CPU host's device and cluster profile from kernel-level measurements."""

from __future__ import annotations

import argparse
import json
import sys

from autoplan.errors import SpecError

SHIPPED_DEVICE = "cpu-calibrated"
SHIPPED_CLUSTER = "cpu-local-calibrated"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate", help="fit this CPU host's device + cluster profile from microbenchmarks; write YAML",
        description="Times GEMMs, attention and element-wise kernels on one thread, the host time of eager ops, "
                    "DTensor modules, FSDP2 units, pipeline actions and the optimizer, the process's memory "
                    "baseline, and gloo collectives for worlds of 2..N ranks; fits the device fields and the "
                    "alpha-beta of every collective, and writes them with every point's residual. Only kernel- "
                    "and op-level timings are fitted, never training runs.")
    p.add_argument("--nproc", type=int, default=4, help="ranks of the largest world measured (default 4)")
    p.add_argument("-o", "--output", default=None,
                   help=f"device profile to write (default: profiles/hardware/{SHIPPED_DEVICE}.yaml, shipped)")
    p.add_argument("--cluster-out", default=None,
                   help=f"cluster file to write (default: profiles/clusters/{SHIPPED_CLUSTER}.yaml, shipped)")
    p.add_argument("--raw-out", default=None,
                   help="also save the raw points as JSON (refreshing the shipped files always keeps them in "
                        f"profiles/calibration/{SHIPPED_CLUSTER}.raw.json)")
    p.add_argument("--from-raw", default=None, help="refit saved raw points instead of measuring")
    p.add_argument("--runs", nargs="+", metavar="PLAN:METRICS", default=None,
                   help="optional whole-run refinement: measured runs (plan file:metrics file) to fit the one "
                        "run-level parameter, collective_wait_factor, on every other run and test on the rest "
                        "(reported apart from the kernel-level fit)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.nproc <= 64:
        raise SpecError(f"--nproc: must be between 1 and 64, got {args.nproc}")
    from autoplan.profiler.hardware.calibrate import build_profiles, measure_raw
    from autoplan.profiler.hardware.calibration_fit import summarize
    from autoplan.profiler.hardware.drift import stage_speeds
    from autoplan.schema._files import read_text, write_atomic
    from autoplan.schema._io import dump_yaml, to_dict
    from autoplan.schema.io import PROFILES_DIR

    say = (lambda m: None) if args.quiet else (lambda m: print(f"calibrate: {m}", file=sys.stderr, flush=True))
    if args.from_raw:
        try:
            raw = json.loads(read_text(args.from_raw))
        except json.JSONDecodeError as err:
            raise SpecError(f"--from-raw: {args.from_raw} is not JSON ({err.msg}, line {err.lineno})") from None
    else:
        raw = measure_raw(args.nproc, say)
    shipped = args.output is None
    if args.raw_out:
        write_atomic(args.raw_out, json.dumps(raw))
    if shipped and not args.from_raw:  # the shipped files stay the fit of the shipped raw points (a test checks)
        write_atomic(PROFILES_DIR / "calibration" / f"{SHIPPED_CLUSTER}.raw.json", json.dumps(raw))
    device_out = args.output or str(PROFILES_DIR / "hardware" / f"{SHIPPED_DEVICE}.yaml")
    cluster_out = args.cluster_out or str(PROFILES_DIR / "clusters" / f"{SHIPPED_CLUSTER}.yaml")
    device, cluster = build_profiles(raw, SHIPPED_DEVICE if shipped else "calibrated-cpu",
                                     SHIPPED_CLUSTER if shipped else "calibrated-cpu-local")
    refinement = None
    if args.runs:
        pairs = []
        for item in args.runs:
            plan_path, sep, metrics_path = item.rpartition(":")
            if not sep or not plan_path or not metrics_path:
                raise SpecError(f"--runs: {item!r} is not PLAN:METRICS (a plan file, a colon, its metrics file)")
            pairs.append((plan_path, metrics_path))
        from autoplan.report.refine import refine

        say(f"refinement: {len(pairs)} measured runs")
        refinement = refine(cluster, pairs)
        import dataclasses

        cluster = dataclasses.replace(cluster, collective_wait_factor=refinement.factor)
    header = (f"# {device.name}: fitted by `autoplan calibrate --nproc {raw['nproc']}` from kernel and op "
              "microbenchmarks (residuals: every measured point against the fitted fields)\n")
    write_atomic(device_out, dump_yaml(device, header))
    data = to_dict(cluster)
    data["device"] = SHIPPED_DEVICE if shipped else to_dict(device)  # shipped: by name; else embedded
    cluster_header = (f"# {cluster.name}: {cluster.devices_per_node} gloo ranks on {cluster.cores_per_node} cores "
                      f"of this machine, fitted by `autoplan calibrate --nproc {raw['nproc']}`\n")
    write_atomic(cluster_out, dump_yaml(data, cluster_header))
    print(f"device {device.name}: GEMM peak {device.peak_fp32_tflops:.4f} TFLOP/s (one thread), half size "
          f"{device.matmul_half_size_gflop:.5f} GFLOP; memory {device.memory_bandwidth_gb_per_s:.2f} GB/s; "
          f"{len(device.attention_points)} attention points")
    print(f"  host per op: fwd {device.host_op_us:.2f} us (view {device.host_view_op_us:.2f}), bwd "
          f"{device.host_backward_op_us:.2f} us (view {device.host_backward_view_op_us:.2f}); TP module "
          f"{device.tp_module_fwd_us:.1f}/{device.tp_module_bwd_us:.1f} us; FSDP2 unit {device.fsdp_unit_fwd_us:.1f}/"
          f"{device.fsdp_unit_bwd_us:.1f} us (hooks alone {device.fsdp_hooks_fwd_us:.1f}/{device.fsdp_hooks_bwd_us:.1f}); "
          f"pipeline action {device.pipeline_action_us:.1f} us")
    print(f"  optimizer: {device.optimizer_tensor_us:.1f} us per tensor ({device.optimizer_dtensor_us:.1f} DTensor), "
          f"{device.optimizer_ns_per_param:.2f} ns per parameter; process baseline {device.memory_baseline_gib:.3f} GiB")
    probes = "; ".join(f"{p['gemm_us']:.0f}/{p['op_us']:.2f}" for p in raw.get("speed_probes", ()))
    print(f"  speed probes (runtime/train/speed_probe.py): GEMM {device.probe_gemm_us:.0f} us, eager op "
          f"{device.probe_op_us:.2f} us" + (f" (between stages, GEMM/op us: {probes})" if probes else ""))
    speeds = stage_speeds(raw.get("speed_probes", []))
    if speeds:
        print("  stage speeds against the mean, kernels/host work (each stage's fields put at the mean): "
              + ", ".join(f"{stage} {v.kernel:.2f}/{v.host:.2f}" for stage, v in speeds.items()))
    print(f"cluster {cluster.name}: {cluster.devices_per_node} ranks share {cluster.cores_per_node} cores; "
          f"{len(cluster.collectives)} collective fits")
    if cluster.corun_kernel_slowdown:
        print(f"  co-running ranks 1..{len(cluster.corun_kernel_slowdown)}: kernel slow-down "
              f"{', '.join(f'{x:.2f}' for x in cluster.corun_kernel_slowdown)}; host slow-down "
              f"{', '.join(f'{x:.2f}' for x in cluster.corun_host_slowdown)}")
    else:
        print("  co-running ranks not measured (raw points without them): slow-down max(1, ranks / cores)")
    if cluster.late_receive_us:
        print(f"  a pipeline receive posted after its send, ranks 2..{len(cluster.late_receive_us)} computing: waits "
              f"{', '.join(f'{x / 1e3:.2f}' for x in cluster.late_receive_us[1:])} ms")
    for c in cluster.collectives:
        if c.ranks == raw["nproc"] or c.group_size == 2:
            print(f"  {c.collective:<15} n={c.group_size} ranks={c.ranks}: alpha {c.alpha_us:8.1f} us, "
                  f"busbw {c.busbw_gb_per_s:7.3f} GB/s")
    print("residuals (|fitted - measured| / measured): field, points, median, max")
    for field, n, med, worst in summarize(device.residuals + cluster.residuals):
        print(f"  {field:<58} {n:3d}  {100 * med:6.1f}%  {100 * worst:6.1f}%")
    if refinement is not None:
        r = refinement
        test = (f"held-out {len(r.test_runs)} runs {100 * r.test_error_before:.1f}% -> {100 * r.test_error_after:.1f}%"
                if r.test_runs else "no held-out runs")
        print(f"run-level refinement (separate from the kernel-level fit above): collective_wait_factor "
              f"{r.factor} fitted on {len(r.fit_runs)} runs, median |step error| {100 * r.fit_error_before:.1f}% -> "
              f"{100 * r.fit_error_after:.1f}%; {test}")
        for name in r.fit_runs:
            print(f"  fit:  {name}")
        for name in r.test_runs:
            print(f"  test: {name}")
    print(f"wrote {device_out} and {cluster_out}", file=sys.stderr)
    return 0
