"""A DCP checkpoint of ours as a Hugging Face model folder (``autoplan export-hf``, ``run --save-hf``).

One process, no process group: DCP's reader assembles each full tensor from every rank's shards
(``dcp.load(..., no_dist=True)`` into plain tensors of the stored sizes, model keys only: the optimizer
state, 2-3x the weights, is never read). The vocabulary tensors are cut back to ``vocab_size`` rows (the
checkpoint holds the saving layout's padded rows), names are mapped (names.py), GPT-2's Conv1D weights
transposed and q, k, v fused into ``c_attn``; an MoE block's 3-D expert weights are cut into the one
tensor per expert the Hub's Mixtral and Qwen3-MoE folders hold (names.py ``per_expert``). Written as
``model.safetensors``, or, past ``max_shard_bytes`` (5 GB, transformers' default), as
``model-0000X-of-0000Y.safetensors`` with ``model.safetensors.index.json``; plus ``config.json`` (config.py).

Memory: one output shard at a time (its tensors and the runtime tensors they are made of), so at most
about twice ``max_shard_bytes`` whatever the model's size; an expert stack is read whole (all E experts of
one matrix of one block: 0.9 GB in bf16 for Mixtral-8x7B) by each output shard holding one of its experts.

The folder appears whole or not at all: everything is written into ``OUT.tmp`` and renamed; an existing
non-empty ``OUT`` is replaced only when asked (``force``), after the new one is complete.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from autoplan.errors import SpecError
from autoplan.schema import ModelSpec
from runtime.hf.config import hf_config
from runtime.hf.files import CONFIG, INDEX, SINGLE, check_output
from runtime.hf.names import VOCAB_TENSORS, Source, pieces

DEFAULT_SHARD_BYTES = 5 * 10**9
"""transformers' ``max_shard_size="5GB"``."""
GROUP = "model"
"""The checkpoint's model keys are ``model.<runtime name>`` (runtime/train/checkpoint.py)."""


def _stored(folder: Path) -> dict:
    try:
        return dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    except Exception as err:  # DCP raises several types for a missing or damaged .metadata
        raise SpecError(f"{folder}: not a DCP checkpoint ({type(err).__name__}: {str(err)[:120]})") from None


def read_model_tensors(folder: Path, names: list[str], stored: dict) -> dict[str, torch.Tensor]:
    """The full tensors of the runtime parameters ``names`` (checkpoint keys ``model.<name>``)."""
    state = {}
    for name in names:
        meta = stored.get(f"{GROUP}.{name}")
        if meta is None or not hasattr(meta, "size"):
            raise SpecError(f"{folder}: holds no tensor {GROUP}.{name}; it is not a checkpoint of this model")
        state[name] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized, assuming ... a single process": yes
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({GROUP: state}, storage_reader=dcp.FileSystemReader(str(folder)), no_dist=True)
    return state


def _assemble(parts: list[tuple[str, Source]], tensors: dict[str, torch.Tensor], spec: ModelSpec) -> torch.Tensor:
    """One Hugging Face tensor from its runtime parameters (several for GPT-2's fused c_attn)."""
    out, expected_start = [], 0
    for name, src in parts:
        t = tensors[name]
        if src.expert is not None:
            t = t[src.expert]  # one expert of a stacked MoE weight
        if name in VOCAB_TENSORS:
            t = t[: spec.vocab_size]  # the padded rows of the saving layout are not part of the model
        if src.transposed and t.ndim == 2:
            t = t.T
        assert src.start == expected_start, (name, src)
        expected_start += t.shape[src.out_dim(t.ndim)]
        out.append(t)
    dim = parts[0][1].out_dim(out[0].ndim)
    return (out[0] if len(out) == 1 else torch.cat(out, dim=dim)).contiguous()


def _shards(sizes: dict[str, int], max_bytes: int) -> list[list[str]]:
    """Keys in order, cut into runs of at most ``max_bytes`` (a larger tensor alone), as transformers does."""
    shards: list[list[str]] = [[]]
    used = 0
    for key, size in sizes.items():
        if shards[-1] and used + size > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(key)
        used += size
    return shards


def export_checkpoint(checkpoint: str | os.PathLike, out: str | os.PathLike, spec: ModelSpec, force: bool = False,
                      max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[str]:
    """Write the model weights of the checkpoint folder ``checkpoint`` (one ``step_N``) as a Hugging Face
    folder ``out``; returns the names of the files written."""
    folder, target = Path(checkpoint), Path(out)
    check_output(target, force)
    stored = _stored(folder)
    pos = stored.get(f"{GROUP}.embed.pos.weight")
    positions = int(pos.size[0]) if pos is not None and spec.architecture == "gpt" else None
    layout = pieces(spec, seq_len=positions)
    sizes = {}
    for key, parts in layout.items():
        n = 0
        for name, src in parts:
            meta = stored.get(f"{GROUP}.{name}")
            if meta is None or not hasattr(meta, "size"):
                raise SpecError(f"{folder}: holds no tensor {GROUP}.{name}; it is not a checkpoint of this model")
            shape = list(meta.size)[1:] if src.expert is not None else list(meta.size)
            if name in VOCAB_TENSORS:
                shape[0] = min(shape[0], spec.vocab_size)
            n += math.prod(shape) * meta.properties.dtype.itemsize
        sizes[key] = n
    shards = _shards(sizes, max_shard_bytes)
    tmp = Path(f"{target}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        weight_map, written = {}, []
        for i, keys in enumerate(shards):
            file = SINGLE if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            names = list(dict.fromkeys(name for k in keys for name, _ in layout[k]))  # an expert stack once
            tensors = read_model_tensors(folder, names, stored)
            out = {k: _assemble(layout[k], tensors, spec) for k in keys}
            save_file(out, str(tmp / file), metadata={"format": "pt"})  # transformers wants format "pt"
            weight_map |= {k: file for k in keys}
            written.append(file)
            del tensors
        if len(shards) > 1:
            index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
            (tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n")
            written.append(INDEX)
        (tmp / CONFIG).write_text(json.dumps(hf_config(spec, positions), indent=2) + "\n")
        written.append(CONFIG)
        _replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return written


def _replace(tmp: Path, target: Path) -> None:
    """``tmp`` becomes ``target``; an old ``target`` is removed only after the rename."""
    if target.is_dir() and not any(target.iterdir()):
        target.rmdir()
    if target.exists():
        old = Path(f"{target}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)
