"""``autoplan profile-hardware``: measure this machine; write a device profile and a cluster file."""

from __future__ import annotations

import argparse
import sys

from autoplan.errors import SpecError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile-hardware", help="measure matmul, memory and collectives here; write device and cluster YAML",
        description="Times GEMMs over shapes and dtypes, memory bandwidth, and all-reduce / all-gather / "
                    "reduce-scatter / send-recv for group sizes 2..N in N spawned processes (NCCL with one GPU "
                    "per rank, else gloo), fits the efficiency and alpha-beta parameters, and writes them in the "
                    "form of profiles/hardware/*.yaml and profiles/clusters/*.yaml.")
    p.add_argument("--nproc", type=int, default=2, help="ranks to spawn for the collectives (default 2; 1 skips them)")
    p.add_argument("-o", "--output", default="device.yaml", help="device profile to write (default device.yaml)")
    p.add_argument("--cluster-out", default=None, help="cluster file to write (default: none)")
    p.add_argument("--name", default=None, help="device profile name (default measured-...)")
    p.add_argument("--peak-from", default=None,
                   help="shipped device name or file whose datasheet peaks to fit efficiencies against")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.nproc < 1 or args.nproc > 64:
        raise SpecError(f"--nproc: must be between 1 and 64, got {args.nproc}")
    from autoplan.profiler.hardware.measure import fits_table, profile_hardware
    from autoplan.schema._io import dump_yaml, write_atomic

    result = profile_hardware(args.nproc, args.name, args.peak_from, progress=not args.quiet)
    device = result.device
    header = f"# {device.name}: measured by autoplan profile-hardware. {device.source}\n"
    write_atomic(args.output, dump_yaml(device, header))
    print(f"{device.name}: fp32 {device.peak_fp32_tflops:.4f} / bf16 {device.peak_bf16_tflops:.4f} TFLOP/s peak, "
          f"matmul ceiling {device.matmul_efficiency}, half size {device.matmul_half_size_gflop} GFLOP; memory "
          f"{device.memory_bandwidth_gb_per_s} GB/s x {device.memory_efficiency}; kernel {device.kernel_overhead_us} us")
    for line in fits_table(result.fits)[1:]:
        print(line[1:].strip())
    print(f"wrote {args.output}", file=sys.stderr)
    if args.cluster_out:
        lines = "\n".join(fits_table(result.fits)) + "\n" if result.fits else ""
        cluster_header = (f"# {result.cluster.name}: {result.cluster.devices_per_node} ranks on this machine, "
                          f"measured by autoplan profile-hardware (device profile embedded)\n{lines}")
        write_atomic(args.cluster_out, dump_yaml(result.cluster, cluster_header))
        link = result.cluster.intra_node
        print(f"cluster {result.cluster.name}: {link.bandwidth_gb_per_s} GB/s bus bandwidth, "
              f"{link.latency_us} us per hop ({result.cluster.backend})")
        print(f"wrote {args.cluster_out}", file=sys.stderr)
    return 0
