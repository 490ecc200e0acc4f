"""Checkpoints with torch.distributed.checkpoint (DCP): model + optimizer (+ step = data position) + RNG.

Model and optimizer go through get_state_dict/set_state_dict (so a checkpoint can be loaded into another
layout), except ZeRO-1 optimizer shards, which are saved per rank and load only into the same layout.

Layout: ``DIR/step_N/`` holds DCP's files, ``rng_rank{r}.pt`` per rank and ``COMPLETE``. A save writes
into ``DIR/step_N.tmp/``; after every rank has finished (barrier) rank 0 writes COMPLETE and renames the
folder to ``step_N``, so a crash mid-save leaves only a ``.tmp`` folder that resume ignores. COMPLETE
holds every file's SHA-256 (``integrity.py``), verified before a resume.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict, get_state_dict, set_model_state_dict, set_state_dict,
)

from runtime.train.integrity import write_complete


def _state(model: nn.Module, optimizer) -> dict:
    # the FQNs are the full model's (blocks keep their global index) for a single stage per rank
    if hasattr(optimizer, "sharded_state"):  # ZeRO-1: per-rank optimizer shards (see Zero1AdamW)
        return {"model": get_model_state_dict(model), "zero1": optimizer.sharded_state()}
    # flattened: optimizer keys by parameter FQN ("param_groups.blocks.4.attn.q.weight.lr") instead of by
    # group index ("param_groups.0.lr"), which every pipeline stage shares, so DCP kept one stage's groups
    # and the others lost lr/betas on load (KeyError 'betas' at the first resumed step; torchtitan does the same)
    msd, osd = get_state_dict(model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True))
    return {"model": msd, "optim": osd}


def save(directory: str, step: int, model: nn.Module, optimizer, plan=None) -> Path:
    root = Path(directory)
    final, tmp = root / f"step_{step}", root / f"step_{step}.tmp"
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save(_state(model, optimizer), checkpoint_id=str(tmp))
    rng = {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}
    torch.save({"step": step, "rng": rng}, tmp / f"rng_rank{rank}.pt")
    dist.barrier()  # every rank's shard and RNG file is on disk
    if plan is not None:
        write_complete(tmp, step, plan)  # COMPLETE with every file's SHA-256 (collective)
    elif rank == 0:
        (tmp / "COMPLETE").write_text(f"{step}\n")
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    dist.barrier()
    return final


def latest(directory: str) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    root = Path(directory)
    done = [p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp") and (p / "COMPLETE").exists()]
    return max(done, key=lambda p: int(p.name.split("_")[1]), default=None)


def load(path: Path, model: nn.Module, optimizer) -> int:
    """Restore in place; returns the number of optimizer steps already taken."""
    state = _state(model, optimizer)  # also creates empty Adam state for DCP to fill (runtime-notes §7)
    dcp.load(state, checkpoint_id=str(path))
    if "zero1" in state:  # DCP loaded the optimizer shards in place
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(flatten_optimizer_state_dict=True))
    extra = torch.load(path / f"rng_rank{dist.get_rank()}.pt", weights_only=False)
    torch.set_rng_state(extra["rng"]["torch"])
    if extra["rng"]["cuda"] is not None:
        torch.cuda.set_rng_state(extra["rng"]["cuda"])
    return int(extra["step"])
