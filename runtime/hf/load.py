"""``--init-from DIR``: fill a rank's materialised (maybe sharded) stage models from a Hugging Face folder.

Each parameter reads only the box of the stored tensor this rank holds. Which global indices a DTensor's
local shard holds along each dimension is asked of torch itself: a 1-D ``arange`` over that dimension
is distributed with the parameter's own mesh and placements (``distribute_tensor(...,
src_data_rank=None)``: local slicing, no communication, as runtime/models/init.py cuts its full values),
so every placement torch can build is covered: TP's Shard, FSDP2's Shard(0) (uneven included), FSDP2 over
TP's ``_StridedShard``, replicate. (``compute_local_shape_and_global_offset`` gives one offset per
dimension, which a strided shard that is not contiguous cannot be described by.) The box is then read
with safetensors' ``get_slice`` (only those bytes leave the file), transposed for GPT-2's Conv1D, cast to
the parameter's dtype and copied into the local shard.

Our own reader because torch's ``HuggingFaceStorageReader`` (DCP) maps names one to one: it cannot pad a
vocabulary to the plan's ``padded_vocab_size``, split GPT-2's fused ``c_attn`` or transpose Conv1D.

An MoE block's expert weights are 3-D parameters [E, ...] whose experts the Hub stores one tensor each
(names.py ``per_expert``): a rank reads, for each expert index it holds on dim 0 (its expert-parallel
slice, in its local order), that expert's tensor's box on the other dimensions (all of it, or an
expert-tensor-parallel shard's rows or columns), and stacks them; the tensors of experts it does not
hold are never opened.

Padded vocabulary rows (past ``vocab_size``) are zeros, as init.py makes them; a tied head copy on a last
stage of another pipeline rank reads the embedding (``canonical_name``). Buffers (RoPE tables) are
derived from the spec (``init_buffers``), not read. With CPU offload FSDP2 keeps the shards on the host:
the copy goes wherever the parameter lives.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

from autoplan.errors import SpecError
from autoplan.schema import ModelSpec
from runtime.hf.files import stored_tensors
from runtime.hf.names import VOCAB_TENSORS, Source, per_expert, resolve_key, source, stored_box
from runtime.models.init import canonical_name


def held_indices(p: torch.Tensor) -> list[torch.Tensor]:
    """For each dimension of ``p``'s global shape, the global indices its local tensor holds, in local
    order (int64, on the CPU). A plain tensor holds everything."""
    if not isinstance(p, DTensor):
        return [torch.arange(n) for n in p.shape]
    out = []
    for d, n in enumerate(p.shape):
        placements = []
        for pl in p.placements:
            if isinstance(pl, _StridedShard) and pl.dim % p.ndim == d:
                placements.append(_StridedShard(0, split_factor=pl.split_factor))
            elif isinstance(pl, Shard) and pl.dim % p.ndim == d:
                placements.append(Shard(0))
            else:
                placements.append(Replicate())
        index = torch.arange(n, device=p.device_mesh.device_type)
        out.append(distribute_tensor(index, p.device_mesh, placements, src_data_rank=None).to_local().cpu())
    return out


def one_range(index: torch.Tensor) -> bool:
    """Whether the global indices are consecutive and ascending: the shard is one slice of the dimension."""
    return bool(index.numel() == 0 or (index == torch.arange(int(index[0]), int(index[0]) + index.numel())).all())


def read_box(handle, src: Source, index: list[torch.Tensor], real_rows: int | None) -> torch.Tensor:
    """The runtime tensor's values at the global ``index`` (one index list per dimension) read from the
    stored tensor ``handle`` (a safetensors slice); rows at or past ``real_rows`` (padded vocabulary) zero."""
    shape = tuple(i.numel() for i in index)
    keep = None
    if real_rows is not None and index[0].numel() and int(index[0].max()) >= real_rows:
        keep = index[0] < real_rows
        index = [index[0][keep], *index[1:]]
    if any(i.numel() == 0 for i in index):
        return torch.zeros(shape)  # only padding rows here (cast to the parameter's dtype by the caller)
    box = [(int(i.min()), int(i.max()) + 1) for i in index]
    values = handle[tuple(slice(lo, hi) for lo, hi in stored_box(src, box))]
    if src.transposed and values.ndim == 2:
        values = values.T
    for d, i in enumerate(index):
        if not one_range(i):  # a non-contiguous shard: read its span, keep its indices
            values = values.index_select(d, i - box[d][0])
    if keep is None:
        return values
    out = values.new_zeros(shape)
    out[keep] = values
    return out


def read_parameter(tensor: Callable[[str], object], src: Source, index: list[torch.Tensor],
                   real_rows: int | None) -> torch.Tensor:
    """The runtime parameter's values at the global ``index`` (``read_box``), ``tensor`` giving a stored
    tensor's slice handle by key; a stacked MoE weight reads the box of each held expert's own tensor
    (only those experts' tensors are asked for) and stacks them in the local order."""
    if not src.experts:
        return read_box(tensor(src.key), src, index, real_rows)
    experts = per_expert(src)
    rows = [read_box(tensor(experts[e].key), experts[e], index[1:], None) for e in index[0].tolist()]
    return torch.stack(rows) if rows else torch.zeros(tuple(i.numel() for i in index))


@torch.no_grad()
def load_hf_weights(models: list[nn.Module], spec: ModelSpec, folder: str | os.PathLike) -> None:
    """Fill every parameter of ``models`` (this rank's materialised stage models) from the Hugging Face
    folder ``folder``, which ``files.check_init_folder`` has accepted for ``spec``."""
    stored = stored_tensors(folder)
    with contextlib.ExitStack() as files:
        handles: dict[str, object] = {}

        def tensor(key: str):
            actual = resolve_key(key, stored)
            if actual is None:  # checked before launch; a folder changed since is a bad input still
                raise SpecError(f"--init-from: {folder}: tensor {key!r} is missing")
            file = stored[actual].file
            if file not in handles:
                handles[file] = files.enter_context(safe_open(Path(folder) / file, framework="pt", device="cpu"))
            return handles[file].get_slice(actual)

        for model in models:
            for name, p in model.named_parameters():
                canon = canonical_name(name, spec)
                src = source(canon, spec)
                real_rows = spec.vocab_size if canon in VOCAB_TENSORS else None
                values = read_parameter(tensor, src, held_indices(p), real_rows)
                local = p.to_local() if isinstance(p, DTensor) else p.data
                if tuple(values.shape) != tuple(local.shape):
                    raise RuntimeError(f"{name}: read {tuple(values.shape)} for a local shard of {tuple(local.shape)}")
                local.copy_(values.to(device=local.device, dtype=local.dtype))
