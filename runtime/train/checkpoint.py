"""Checkpoints with torch.distributed.checkpoint (DCP): model + optimizer (+ step = data position) + RNG.

Every layout writes and reads the same names, the full model's: each stage model keeps the full
model's parameter names (blocks keyed by global index), each stage has its own optimizer, and the state
is the union of the stages' ``get_model_state_dict`` / flattened ``get_optimizer_state_dict``
(torchtitan's ModelWrapper / OptimizersContainer), so a rank holding several interleaved stages writes
the same keys as the ranks of any other layout. Parameters and optimizer state are DTensors (TP, FSDP2,
replicate) or plain tensors, which DCP reshards on load: a checkpoint loads into any tp / pp / dp / ZeRO.
``load_weights`` reads the model's keys only (``autoplan eval``: no optimizer state is made or read).
A tied embedding is stored once, as ``embed.tok.weight``; a last stage on another pipeline rank, whose
head holds a copy, saves nothing for it and loads the copy (and its optimizer state) from that name.

Padded vocabulary (the plan's ``padded_vocab_size`` depends on tp): saved padded, as the layout holds
it; loaded into another padded size by reading the stored tensor whole (every rank, a plain tensor DCP
fills from the shards), keeping its ``vocab_size`` real rows, zero padding rows, and taking this
rank's shard. Only vocabulary tensors (embedding, head and their optimizer state) are resized; the
transient is one full stored tensor per rank (llama3-70b's padded embedding: 4.0 GiB in fp32).

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
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict, get_optimizer_state_dict, set_model_state_dict,
    set_optimizer_state_dict,
)

from autoplan.schema import ModelSpec
from runtime.train.integrity import write_complete
from runtime.models.init import VOCAB_TENSORS  # the embedding and head, the tensors padding resizes
from runtime.train.manifest import read_manifest
from runtime.train.optim import Optimizers

TIED, TIED_COPY = "embed.tok.weight", "head.weight"
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


def _renamed(state: dict, old: str, new: str) -> dict:
    """Model keys ``old`` and flattened optimizer keys ``state.old.*`` / ``param_groups.old.*`` renamed."""
    def rename(key: str) -> str:
        if key == old:
            return new
        for kind in ("state.", "param_groups."):
            if key.startswith(kind + old + "."):
                return kind + new + key[len(kind + old):]
        return key
    return {rename(k): v for k, v in state.items()}


def _holds_tied_copy(model: nn.Module, spec: ModelSpec) -> bool:
    """A last stage whose head is a copy of the tied embedding held by another pipeline rank."""
    return spec.tie_embeddings and getattr(model, "head", None) is not None and getattr(model, "embed", None) is None


def _model_part(model: nn.Module, spec: ModelSpec) -> dict:
    """One stage model's state under the full model's names (a tied embedding once, as ``embed.tok.weight``)."""
    msd = get_model_state_dict(model)
    if _holds_tied_copy(model, spec):
        return _renamed(msd, TIED_COPY, TIED)
    if spec.tie_embeddings:
        msd.pop(TIED_COPY, None)  # the same tensor as embed.tok.weight
    return msd


def _part_state(model: nn.Module, optimizer, spec: ModelSpec) -> tuple[dict, dict]:
    msd = _model_part(model, spec)
    osd = get_optimizer_state_dict(model, optimizer, options=FLAT)  # also creates empty state to load into
    return msd, _renamed(osd, TIED_COPY, TIED) if _holds_tied_copy(model, spec) else osd


def _state(models: list[nn.Module], optimizers: Optimizers, spec: ModelSpec) -> dict:
    model_sd, optim_sd = {}, {}
    for model, optimizer in zip(models, optimizers.optimizers):
        msd, osd = _part_state(model, optimizer, spec)
        model_sd |= msd
        optim_sd |= osd
    return {"model": model_sd, "optim": optim_sd}


def save(directory: str, step: int, models: list[nn.Module], optimizer: Optimizers | None, spec: ModelSpec,
         plan=None) -> Path:
    """Write step ``step``'s checkpoint; with ``plan``, COMPLETE is a manifest of checksums (integrity.py).
    ``optimizer=None`` writes the weights only (``--save-hf``'s transient checkpoint: not resumable)."""
    root = Path(directory)
    final, tmp = root / f"step_{step}", root / f"step_{step}.tmp"
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    state = (_state(models, optimizer, spec) if optimizer is not None
             else {"model": {k: v for model in models for k, v in _model_part(model, spec).items()}})
    dcp.save(state, checkpoint_id=str(tmp))
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


def _is_vocab_key(key: str) -> bool:
    """A model key ``embed.tok.weight`` / ``head.weight`` or a flattened optimizer key of one of them."""
    return key in VOCAB_TENSORS or any(key.startswith(f"state.{name}.") for name in VOCAB_TENSORS)


def _resized_reads(path: Path, state: dict) -> list[tuple[str, str, torch.Tensor, torch.Tensor]]:
    """Swap each vocabulary tensor saved at another padded size for a full plain tensor of the stored
    shape (which DCP can fill); returns (group, key, the state's tensor, the stand-in)."""
    stored = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    swaps = []
    for group, entries in state.items():
        for key, value in entries.items():
            meta = stored.get(f"{group}.{key}")
            size = getattr(meta, "size", None)
            if (isinstance(value, torch.Tensor) and size is not None and _is_vocab_key(key)
                    and value.dim() == 2 and tuple(size) != tuple(value.shape)):
                stand_in = torch.empty(tuple(size), dtype=value.dtype)
                swaps.append((group, key, value, stand_in))
                entries[key] = stand_in
    return swaps


@torch.no_grad()
def _copy_rows(target: torch.Tensor, stored: torch.Tensor, vocab_size: int) -> None:
    """``target`` (this layout's padded tensor, maybe a DTensor) := stored's real rows, zero padding."""
    full = torch.zeros(tuple(target.shape), dtype=target.dtype)
    full[:vocab_size] = stored[:vocab_size]
    if isinstance(target, DTensor):
        local = distribute_tensor(full.to(target.device), target.device_mesh, target.placements, src_data_rank=None)
        target.to_local().copy_(local.to_local())
    else:
        target.copy_(full.to(target.device))


def _read(path: Path, state: dict, spec: ModelSpec) -> None:
    """Fill ``state``'s tensors in place from the checkpoint, vocabulary tensors resized (module docstring)."""
    swaps = _resized_reads(path, state)
    dcp.load(state, checkpoint_id=str(path))  # fills the tensors of ``state`` in place
    for group, key, target, stored in swaps:
        _copy_rows(target, stored, spec.vocab_size)
        state[group][key] = target


def _saved_step(path: Path) -> int:
    manifest = read_manifest(path)  # None: a plain step number, written before manifests
    return manifest.step if manifest is not None else int((path / "COMPLETE").read_text())


def load_weights(path: Path, models: list[nn.Module], spec: ModelSpec) -> int:
    """Only the model's weights, in place, from a checkpoint of any layout (DCP reads just those keys;
    ``autoplan eval``); returns the checkpoint's step."""
    state = {"model": {k: v for model in models for k, v in _model_part(model, spec).items()}}
    _read(path, state, spec)
    for model in models:
        msd = _renamed(state["model"], TIED, TIED_COPY) if _holds_tied_copy(model, spec) else state["model"]
        set_model_state_dict(model, msd, options=StateDictOptions(strict=False))  # other stages' keys too
    return _saved_step(path)


def load(path: Path, models: list[nn.Module], optimizer: Optimizers, spec: ModelSpec) -> int:
    """Restore in place, from a checkpoint of any layout; returns the number of optimizer steps taken."""
    state = _state(models, optimizer, spec)
    _read(path, state, spec)
    for model, opt in zip(models, optimizer.optimizers):
        msd, osd = state["model"], state["optim"]
        if _holds_tied_copy(model, spec):
            msd, osd = _renamed(msd, TIED, TIED_COPY), _renamed(osd, TIED, TIED_COPY)
        set_model_state_dict(model, msd, options=StateDictOptions(strict=False))  # other stages' keys too
        set_optimizer_state_dict(model, opt, osd, options=FLAT)
    # nothing in training draws from torch's RNG (data, init and dropout masks have their own seeded
    # generators), so the RNG files are restored where the rank existed in the saving layout, else skipped
    rng_file = path / f"rng_rank{dist.get_rank()}.pt"
    if rng_file.exists():
        extra = torch.load(rng_file, weights_only=False)
        torch.set_rng_state(extra["rng"]["torch"])
        if extra["rng"]["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(extra["rng"]["cuda"])
    return _saved_step(path)
