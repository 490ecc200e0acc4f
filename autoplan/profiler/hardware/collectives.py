"""Collective timings in ``nproc`` spawned processes (torch.multiprocessing, one rank each).

Backend: NCCL when there is one GPU per rank, else gloo on CPU tensors (CI, laptops, one-GPU boxes).
For each group size n = 2..nproc the first n ranks form a group and time all-reduce, all-gather
(``all_gather_into_tensor``) and reduce-scatter (``reduce_scatter_tensor``) at each message size, where
the size is always the full, unsharded tensor; ranks 0 and 1 also time send/recv as a ping-pong (half
the round trip). Each point is the median of ``repeats`` runs after a warm-up, each run bracketed by a
barrier of the group. Rank 0 writes the raw points as JSON; ``fit`` turns them into alpha-beta fits.

Threads: each rank uses one intra-op thread (OMP_NUM_THREADS=1), as ``autoplan run`` does on CPU.
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

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def measure_collectives(nproc: int, sizes_bytes: list[int], repeats: int = 3) -> dict:
    """{"backend": ..., "points": [{"collective", "group_size", "bytes", "seconds"}, ...]}."""
    use_nccl = torch.cuda.is_available() and torch.cuda.device_count() >= nproc
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "points.json"
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        mp.spawn(_worker, args=(nproc, sizes_bytes, repeats, use_nccl, tmp, str(out)), nprocs=nproc, join=True)
        return json.loads(out.read_text())


def _worker(rank: int, nproc: int, sizes: list[int], repeats: int, use_nccl: bool, tmp: str, out: str) -> None:
    torch.set_num_threads(1)
    backend = "nccl" if use_nccl else "gloo"
    device = torch.device("cuda", rank) if use_nccl else torch.device("cpu")
    if use_nccl:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=nproc)
    points = []
    for n in range(2, nproc + 1):
        group = dist.new_group(list(range(n)))  # every rank must take part in creating every group
        if rank < n:
            for kind in COLLECTIVES:
                for size in sizes:
                    points.append(_point(kind, n, size, _time_collective(kind, n, size, group, device, repeats)))
        dist.barrier()
    pair = dist.new_group([0, 1])
    if rank < 2:
        for size in sizes:
            points.append(_point("send_recv", 2, size, _time_ping_pong(rank, size, pair, device, repeats)))
    dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps({"backend": backend, "points": points}))
    dist.barrier()
    dist.destroy_process_group()


def _point(kind: str, n: int, size: int, seconds: float) -> dict:
    return {"collective": kind, "group_size": n, "bytes": size, "seconds": seconds}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tensor_collectives():
    """(all-gather, reduce-scatter) into / from one flat tensor: torch 2.13 renames them ``*_single`` and
    deprecates ``all_gather_into_tensor`` / ``reduce_scatter_tensor``, which older torch has alone."""
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor,
            getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)


def _time_collective(kind: str, n: int, size: int, group, device: torch.device, repeats: int) -> float:
    numel = max(n, size // 4) // n * n  # fp32 elements, divisible by the group size
    full = torch.ones(numel, device=device)
    shard = torch.ones(numel // n, device=device)
    all_gather, reduce_scatter = tensor_collectives()
    run = {
        "all_reduce": lambda: dist.all_reduce(full, group=group),
        "all_gather": lambda: all_gather(full, shard, group=group),
        "reduce_scatter": lambda: reduce_scatter(shard, full, group=group),
    }[kind]
    times = []
    for i in range(repeats + 1):
        dist.barrier(group=group)
        _sync(device)
        t0 = time.perf_counter()
        run()
        _sync(device)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _time_ping_pong(rank: int, size: int, group, device: torch.device, repeats: int) -> float:
    buf = torch.ones(max(1, size // 4), device=device)
    peer = 1 - rank
    times = []
    for i in range(repeats + 1):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)
        _sync(device)
        if i:
            times.append((time.perf_counter() - t0) / 2)
    return statistics.median(times)
