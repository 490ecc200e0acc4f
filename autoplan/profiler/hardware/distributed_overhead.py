"""Microbenchmarks that need several ranks: collectives as training issues them, FSDP2's host work per
unit and the pipeline runtime's host work per action (the device and cluster fields of schema/hardware.py
and schema/cluster.py that a CPU host needs).

Collectives, for each world of N ranks (N = 2..nproc, one spawn each: a gloo collective on a shared CPU
slows down when ranks outnumber cores, so each fit holds for the rank count it was measured at): for
every group size n = 2..N the world is cut into groups of n consecutive ranks that all run the
collective at once (as all TP groups, or all DP groups, of a step do), at each message size from 4 bytes
(the runtime's scalar all-reduces) up; pairs (0,1), (2,3), ... time send/recv as a ping-pong (half the
round trip). Collectives are measured as a training step issues them: every rank computes a GEMM
segment (``SEGMENT_MNK``, about 1 ms on one core alone, the compute between two TP collectives of the
small models this host trains) and then enters the collective, ``SEGMENT_CALLS`` times in a row; the
point is the median of (that loop - the same loop without the collective, timed right after it) / calls.
Where ranks outnumber cores this is what a collective costs inside a step: members arrive out of step as
the scheduler gives them the cores in turn, and each of gloo's hops waits for its receiver to be
scheduled; back-to-back collectives on otherwise idle ranks (the classic micro-benchmark) measure several
times less on a host whose ranks outnumber its cores than the traces of real steps show. Ranks outside every group (n not dividing N)
run the segments alone, so the cores are as loaded as in a step. Each point is the median of ``repeats``
such pairs after a warm-up, each loop started by a barrier of the world.

Late receives, in every world of N: rank 1 posts a receive about one segment after rank 0 posted the
matching send, while rank 0 and every other rank compute segments (as a pipeline stage that finishes an
action and asks for the input its neighbour sent meanwhile); the point is the mean time from the
receive's post to its completion. On gloo the sender's side must still act once the receive is posted,
and while the ranks keep the cores busy that waits for the scheduler. The distribution has a long tail
and a pipeline pays it on every message, hence the mean. The classic ping-pong, whose receiver is already
waiting, reads an order of magnitude less: it measures the link, not the wait (``autoplan calibrate``
prints both).

In the world of 2 only, with tiny layers whose compute is negligible:

* FSDP2: 8 ``fully_shard`` units (ZeRO-3: all-gather in forward and backward, reduce-scatter in
  backward) against the same 8 plain layers, and the bare all-gather / reduce-scatter of one unit's size
  back to back; the host work per unit is the difference less the collectives.
* replicate (ZeRO-0): the same 8 layers under one ``replicate`` root, against plain, less one all-reduce.
* pipelining: two stages, one per rank, one tiny linear each, run by the runtime's own pipeline (torch's
  schedule runtime with the plan's GPipe lists) at two micro-batch counts; the slope per micro-batch,
  less the layer's own forward and backward, is two actions' host work on the critical path.

Raw points only; ``calibration_fit.py`` (torch-free) fits the fields.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from autoplan.profiler.hardware.collectives import tensor_collectives


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
MESSAGE_BYTES = [4] + [2**k for k in range(10, 23, 2)]  # 4 B, 1 KiB .. 4 MiB
UNIT_FEATURES = 16
UNITS = 8
PIPELINE_MICROBATCHES = (4, 16)
LATE_RECEIVE_BYTES = 65536
LATE_RECEIVE_REPEATS = 40
SEGMENT_MNK = (512, 256, 256)  # 67 MFLOP: ~1 ms of fp32 GEMM on one core
SEGMENT_CALLS = 8
TP_HIDDEN = 64
TP_TOKENS = (48, 192, 768, 3072)  # 12 KiB .. 768 KiB fp32 messages (TP_HIDDEN wide); divisible by 2, 3, 4
TP_PAIRS = 4


def measure_distributed(nproc: int, repeats: int = 7, progress=lambda _m: None) -> dict:
    """{"collectives": [points], "late_receive": [points], "fsdp": {...}, "replicate": {...}, "pipeline": {...}}
    for worlds 2..nproc."""
    result: dict = {"collectives": [], "late_receive": []}
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for world in range(2, nproc + 1):
        progress(f"collectives: world of {world} ranks, group sizes 2..{world}"
                 + (", FSDP2 / replicate / pipeline host work" if world == 2 else ""))
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "points.json"
            mp.spawn(_worker, args=(world, repeats, tmp, str(out)), nprocs=world, join=True)
            data = json.loads(out.read_text())
        result["collectives"] += data.pop("collectives")
        result["late_receive"].append(data.pop("late_receive"))
        result.update(data)
    return result


def _worker(rank: int, world: int, repeats: int, tmp: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world)
    data: dict = {"collectives": _collectives(rank, world, repeats) + _tp_collectives(rank, world, repeats),
                  "late_receive": _late_receive(rank, world)}
    if world == 2:
        data["fsdp"], data["replicate"] = _fsdp(rank)
        data["pipeline"] = _pipeline(rank)
    if rank == 0:
        Path(out).write_text(json.dumps(data))
    dist.barrier()
    dist.destroy_process_group()


def _collectives(rank: int, world: int, repeats: int) -> list[dict]:
    points = []
    segment = _segment()
    for n in range(2, world + 1):
        groups = [dist.new_group(list(range(g, g + n))) for g in range(0, world - n + 1, n)]
        mine = groups[rank // n] if rank // n < len(groups) else None
        for kind in COLLECTIVES:
            for size in MESSAGE_BYTES:
                work = (lambda: _run(kind, n, size, mine)) if mine else None
                seconds = _in_step(segment, work, repeats)
                if rank == 0:
                    points.append({"collective": kind, "group_size": n, "ranks": world, "bytes": size,
                                   "seconds": seconds})
    pairs = [dist.new_group([g, g + 1]) for g in range(0, world - 1, 2)]
    pair = pairs[rank // 2] if rank // 2 < len(pairs) else None
    for size in MESSAGE_BYTES:
        work = (lambda: _ping_pong(rank, size, pair)) if pair else None
        seconds = 0.5 * _in_step(segment, work, repeats)
        if rank == 0:
            points.append({"collective": "send_recv", "group_size": 2, "ranks": world, "bytes": size,
                           "seconds": seconds})
    return points


def _late_receive(rank: int, world: int) -> dict:
    """{"ranks": world, "bytes", "seconds"}: the mean wait of a receive posted after its send (module doc)."""
    segment = _segment()
    buf = torch.ones(LATE_RECEIVE_BYTES // 4)
    waits = []
    for i in range(3 + LATE_RECEIVE_REPEATS):
        dist.barrier()
        if rank == 0:
            work = dist.isend(buf, 1)
            for _ in range(3):
                segment()
            work.wait()
        elif rank == 1:
            segment()
            t0 = time.perf_counter()
            dist.irecv(buf, 0).wait()
            if i >= 3:
                waits.append(time.perf_counter() - t0)
        else:
            for _ in range(3):
                segment()
    seconds = torch.tensor([statistics.mean(waits) if waits else 0.0], dtype=torch.float64)
    dist.broadcast(seconds, src=1)
    return {"ranks": world, "bytes": LATE_RECEIVE_BYTES, "seconds": seconds.item()}


def _tp_collectives(rank: int, world: int, repeats: int) -> list[dict]:
    """``tp_all_reduce``, ``tp_all_gather`` and ``tp_reduce_scatter`` points for every TP size dividing the
    world (module doc)."""
    from torch.distributed.device_mesh import init_device_mesh

    def run(model: nn.Module, x: torch.Tensor) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        model(x).sum().backward()
        return time.perf_counter() - t0

    alone = init_device_mesh("cpu", (world, 1), mesh_dim_names=("dp", "tp"))["tp"]
    points = []
    for n in range(2, world + 1):
        if world % n:
            continue
        mesh = init_device_mesh("cpu", (world // n, n), mesh_dim_names=("dp", "tp"))["tp"]
        for sp in (False, True):
            together, solo = _tp_pairs(mesh, n, n, sp), _tp_pairs(alone, n, 1, sp)
            for tokens in TP_TOKENS:
                # the same local compute: with SP the real mesh gathers the sequence shard to full length
                x_together = torch.randn(tokens // n if sp else tokens, TP_HIDDEN, requires_grad=True)
                x_solo = torch.randn(tokens, TP_HIDDEN, requires_grad=True)
                run(together, x_together), run(solo, x_solo)  # warm-up
                diffs = [run(together, x_together) - run(solo, x_solo) for _ in range(repeats)]
                # no SP: one all-reduce per module (forward or backward); SP: an all-gather and a
                # reduce-scatter per module, which this pattern cannot tell apart: each gets half
                seconds = max(1e-6, statistics.median(diffs) / (2 * TP_PAIRS))
                if rank == 0:
                    for kind in (("tp_all_gather", "tp_reduce_scatter") if sp else ("tp_all_reduce",)):
                        points.append({"collective": kind, "group_size": n, "ranks": world,
                                       "bytes": tokens * TP_HIDDEN * 4, "seconds": seconds / (2 if sp else 1)})
    return points


def _tp_pairs(mesh, n: int, mesh_size: int, sequence_parallel: bool) -> nn.Module:
    """``TP_PAIRS`` Megatron MLP pairs, 4 x TP_HIDDEN wide in all, whose local shards are 4 x TP_HIDDEN / n
    wide on a TP mesh of ``mesh_size`` (n: the real split; 1: the same shards on a mesh of one); with
    ``sequence_parallel`` the activations between pairs are sharded on the sequence (Megatron-SP)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    width = 4 * TP_HIDDEN // n * mesh_size
    model = nn.Sequential(*[m for _ in range(TP_PAIRS) for m in (nn.Linear(TP_HIDDEN, width),
                                                                 nn.Linear(width, TP_HIDDEN))])
    colwise = ColwiseParallel(input_layouts=Shard(0)) if sequence_parallel else ColwiseParallel()
    rowwise = RowwiseParallel(output_layouts=Shard(0)) if sequence_parallel else RowwiseParallel()
    return parallelize_module(model, mesh, {str(i): colwise if i % 2 == 0 else rowwise for i in range(2 * TP_PAIRS)})


def _segment():
    m, n, k = SEGMENT_MNK
    a, b = torch.randn(m, k), torch.randn(k, n)
    return lambda: torch.mm(a, b)


def _busy(segment, collective) -> None:
    """``SEGMENT_CALLS`` x (compute, then the collective), as the layers of a step run them."""
    for _ in range(SEGMENT_CALLS):
        segment()
        if collective is not None:
            collective()


def _in_step(segment, collective, repeats: int) -> float:
    """One collective's share of the busy loop: the median over ``repeats`` pairs of (the loop - the same
    loop without the collective), each pair timed back to back, over ``SEGMENT_CALLS`` (at least 1 us:
    noise can put a loop below its segments). Paired because the host drifts: one reference timed before
    a group size's 24 points let the segments' own speed change under them, and one calibration fitted an
    all-gather alpha of 173 us where the next fitted 2 ms."""
    def loop_s(work) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        _busy(segment, work)
        return time.perf_counter() - t0

    loop_s(collective)  # warm-up
    shares = [loop_s(collective) - loop_s(None) for _ in range(repeats)]
    return max(1e-6, statistics.median(shares) / SEGMENT_CALLS)


def _buffers(n: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    numel = max(n, size // 4) // n * n  # fp32 elements, divisible by the group size
    return torch.ones(numel), torch.ones(numel // n)


def _run(kind: str, n: int, size: int, group) -> None:
    full, shard = _buffers(n, size)
    if kind == "all_reduce":
        dist.all_reduce(full, group=group)
    elif kind == "all_gather":
        tensor_collectives()[0](full, shard, group=group)
    else:
        tensor_collectives()[1](shard, full, group=group)


def _ping_pong(rank: int, size: int, group) -> None:
    buf = torch.ones(max(1, size // 4))
    peer = dist.get_global_rank(group, 1 - dist.get_group_rank(group, rank))
    if dist.get_group_rank(group, rank) == 0:
        dist.send(buf, peer)
        dist.recv(buf, peer)
    else:
        dist.recv(buf, peer)
        dist.send(buf, peer)


def _layers() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(UNIT_FEATURES, UNIT_FEATURES) for _ in range(UNITS)])


def _synced_median(fn, reps: int = 40) -> float:
    """Median over ``reps`` runs that start together on both ranks (a barrier before each; a fixed count,
    never a time budget, so that both ranks run the same collectives)."""
    for _ in range(3):
        dist.barrier()
        fn()
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _fwd_bwd(model: nn.Module, x: torch.Tensor) -> tuple[float, float]:
    fwd = _synced_median(lambda: model(x))

    def both() -> None:
        model(x).sum().backward()
    return fwd, max(0.0, _synced_median(both) - fwd)


def _fsdp(rank: int) -> tuple[dict, dict]:
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    x = torch.randn(4, UNIT_FEATURES)
    plain = _fwd_bwd(_layers(), x)
    sharded = _layers()
    for layer in sharded:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(sharded, mesh=mesh, reshard_after_forward=True)
    fsdp = _fwd_bwd(sharded, x)
    # the runtime's ZeRO-1/2 micro-batches between a step's gathers and reductions: parameters kept
    # unsharded (reshard_after_forward and after backward off) and no gradient sync, so after the warm-up
    # step no collective runs and what remains over the plain layers is the hooks' own work
    kept = _layers()
    for layer in kept:
        fully_shard(layer, mesh=mesh, reshard_after_forward=False)
    fully_shard(kept, mesh=mesh, reshard_after_forward=False)
    kept.set_requires_gradient_sync(False)
    kept.set_reshard_after_backward(False)
    hooks = _fwd_bwd(kept, x)
    unit_bytes = (UNIT_FEATURES * UNIT_FEATURES + UNIT_FEATURES) * 4
    full, shard = _buffers(2, unit_bytes)
    all_gather, reduce_scatter = tensor_collectives()
    gather = _synced_median(lambda: [all_gather(full, shard) for _ in range(UNITS)]) / UNITS
    scatter = _synced_median(lambda: [reduce_scatter(shard, full) for _ in range(UNITS)]) / UNITS
    replicated = _layers()
    replicate(replicated, mesh=mesh)
    rep = _fwd_bwd(replicated, x)
    grads = torch.ones(UNITS * unit_bytes // 4)
    reduce = _synced_median(lambda: dist.all_reduce(grads))
    return ({"units": UNITS, "unit_bytes": unit_bytes, "plain_fwd_s": plain[0], "plain_bwd_s": plain[1],
             "fsdp_fwd_s": fsdp[0], "fsdp_bwd_s": fsdp[1], "all_gather_s": gather, "reduce_scatter_s": scatter,
             "hooks_fwd_s": hooks[0], "hooks_bwd_s": hooks[1]},
            {"plain_fwd_s": plain[0], "plain_bwd_s": plain[1], "replicate_fwd_s": rep[0],
             "replicate_bwd_s": rep[1], "all_reduce_s": reduce})


def _pipeline(rank: int) -> dict:
    from runtime.models.dropout import DropoutState
    from runtime.parallel.pipeline import build_pipeline

    layer = nn.Linear(UNIT_FEATURES, UNIT_FEATURES)
    x = torch.randn(1, UNIT_FEATURES)
    compute_fwd = _synced_median(lambda: layer(x))

    def both() -> None:
        layer(x).sum().backward()
    compute_bwd = max(0.0, _synced_median(both) - compute_fwd)
    steps = {}
    for m in PIPELINE_MICROBATCHES:
        schedule = build_pipeline([nn.Linear(UNIT_FEATURES, UNIT_FEATURES)], [rank], 2, "gpipe", 2, m,
                                  lambda out, target: out.sum(), torch.device("cpu"), None, DropoutState(0), 1, 0)
        batch = torch.randn(m, UNIT_FEATURES)

        def step(s=schedule, b=batch) -> None:
            if rank == 0:
                s.step(b)
            else:
                s.step(target=b, losses=[])
        steps[str(m)] = _synced_median(step)
    return {"microbatches": list(PIPELINE_MICROBATCHES), "step_s": steps, "layer_fwd_s": compute_fwd,
            "layer_bwd_s": compute_bwd}
