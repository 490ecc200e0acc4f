"""How fast this CPU host computes right now: two fixed probes, timed between the steps of a run.

Why: a CPU calibration describes the host when ``autoplan calibrate`` ran, and a shared host (a cloud VM
beside noisy neighbours) does not keep that speed: the same fixed work can take half as long again
minutes later with no process of ours beside it, and the runs' step times move with it. Nor does
everything slow down alike: GEMMs and small eager ops drift by different factors. A prediction can only be judged against a run made at the speed it
assumed, so the calibration records both probes (``DeviceProfile.probe_gemm_us``, ``probe_op_us``), every
CPU run times them again after each step (about 15 ms, outside the timed step), and ``autoplan compare``
re-evaluates the plan on the device as it ran (kernel fields scaled by the GEMM probe, host fields by the
op probe: autoplan/cost/cpu_host/host_speed.py) beside the raw prediction.

Both are kernel-level measurements, never a training step: a [384, 384] x [384, 384] fp32 GEMM (kernel
speed) and an eager ``add`` on a [4, 64, 64] tensor (dispatch, allocation: host speed), on one thread,
medians after warm-up. Only rank 0 probes; the other ranks wait in a barrier (blocked, off the cores).
"""

from __future__ import annotations

import statistics
import time

import torch

GEMM_SIZE = 384
OP_SHAPE = (4, 64, 64)
OP_CALLS = 100


def probe(repeats: int = 5) -> dict[str, float]:
    """``{"gemm_us": one GEMM, "op_us": one eager op}``: medians of ``repeats`` on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(0)
        a = torch.randn(GEMM_SIZE, GEMM_SIZE, generator=generator)
        b = torch.randn(GEMM_SIZE, GEMM_SIZE, generator=generator)
        x = torch.randn(*OP_SHAPE, generator=generator)
        gemm, op = [], []
        for i in range(repeats + 1):  # the first of each is a warm-up
            t0 = time.perf_counter()
            torch.mm(a, b)
            t1 = time.perf_counter()
            for _ in range(OP_CALLS):
                x.add(1.0)
            t2 = time.perf_counter()
            if i:
                gemm.append(t1 - t0)
                op.append((t2 - t1) / OP_CALLS)
        return {"gemm_us": statistics.median(gemm) * 1e6, "op_us": statistics.median(op) * 1e6}
    finally:
        torch.set_num_threads(threads)


def probe_between_steps(device: torch.device) -> dict[str, float] | None:
    """Rank 0's probes with every other rank parked in a barrier (so none competes for the cores); None
    on an accelerator, whose speed these do not measure. Every rank calls it at the same step."""
    import torch.distributed as dist

    if device.type != "cpu":
        return None
    value = probe() if dist.get_rank() == 0 else None
    dist.barrier()
    return value
