"""Initial values that do not depend on the parallel layout.

Each parameter is drawn from its own generator, seeded by (seed, its full-model name), at its full
logical shape; a sharded parameter (a DTensor of TP and/or FSDP2) then keeps its own shard of that full
tensor (``distribute_tensor(..., src_data_rank=None)``: local slicing, no communication). So a parameter
starts with the same values under any tp / pp / dp / ZeRO as in the serial run, and a pipeline stage
built alone (on meta, then materialised) equals the same blocks of the full model.

Values (nanoGPT / GPT-2): N(0, 0.02) for matrices and embeddings (an MoE block's router and its 3-D expert
weights [E, ., .] too, drawn whole), the residual output projections (attn.o, mlp.fc2, mlp.down, and an MoE
block's mlp.experts.down and mlp.shared.down) N(0, 0.02 / sqrt(2 L)), norm weights 1 (Qwen3's per-head ``q_norm`` and
``k_norm`` too), biases 0 (Qwen2's q/k/v biases too): every 1-d parameter is a norm weight or a bias.
A tied head copy on the last pipeline stage takes the embedding's name, hence its values.

Cost at scale: each rank draws the full tensor of every parameter of its stages, one parameter at a time
on its own device, so init time is proportional to the stage's unsharded parameter count (the planner's
llama3-70b plan on 1024 GPUs, tp4 pp2 interleaved: rank 0 holds 41 blocks and the embedding, 36.1e9
values to draw where it keeps 7.1e7) and the transient memory is the largest full parameter (the
128256 x 8192 embedding: 3.9 GiB in fp32); ranks holding shards of the same tensor repeat the draw
instead of communicating. Not measured on a GPU here.
"""

from __future__ import annotations

import math
import zlib

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from autoplan.schema import ModelSpec
from runtime.models.dropout import mix

RESIDUAL_PROJECTIONS = ("attn.o.weight", "mlp.fc2.weight", "mlp.down.weight", "mlp.experts.down",
                        "mlp.shared.down.weight")
"""The projections onto the residual stream (GPT-2's scaled init), an MoE block's expert and shared-expert down
projections included: they take the dense MLP's place (torchtitan scales the experts' ``w2_EDF`` the same way:
torchtitan/models/deepseek_v3/__init__.py ``_depth_init``)."""
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")


def canonical_name(name: str, spec: ModelSpec) -> str:
    """The parameter's name in the serial model: wrapper prefixes dropped, a tied head copy renamed."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    if spec.tie_embeddings and name == "head.weight":
        return "embed.tok.weight"
    return name


VOCAB_TENSORS = ("embed.tok.weight", "head.weight")
"""Parameters with one row per vocabulary entry, padded to the plan's ``padded_vocab_size``."""


def initial_value(name: str, shape: tuple[int, ...], spec: ModelSpec, seed: int, device: torch.device) -> torch.Tensor:
    """The full (unsharded) fp32 initial value of the parameter ``name``. A vocabulary tensor padded past
    ``spec.vocab_size`` rows draws its real rows exactly as the unpadded one does (a generator fills a
    tensor in an order that depends on its size, so the draw is at the unpadded shape) and zeros below."""
    if name in VOCAB_TENSORS and len(shape) == 2 and shape[0] > spec.vocab_size:
        real = initial_value(name, (spec.vocab_size, *shape[1:]), spec, seed, device)
        return torch.cat([real, real.new_zeros((shape[0] - spec.vocab_size, *shape[1:]))])
    if len(shape) == 1:
        fill = 1.0 if "norm" in name and name.endswith("weight") else 0.0
        return torch.full(shape, fill, device=device)
    std = 0.02 / math.sqrt(2 * spec.num_layers) if name.endswith(RESIDUAL_PROJECTIONS) else 0.02
    gen = torch.Generator(device=device).manual_seed(mix(seed, zlib.crc32(name.encode())))
    return torch.empty(shape, device=device).normal_(0.0, std, generator=gen)


@torch.no_grad()
def init_parameters(model: nn.Module, spec: ModelSpec, seed: int) -> None:
    """Fill every parameter of ``model`` (materialised, possibly sharded) with its layout-free value."""
    for name, p in model.named_parameters():
        full = initial_value(canonical_name(name, spec), tuple(p.shape), spec, seed, p.device)
        if isinstance(p, DTensor):
            p.to_local().copy_(distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local())
        else:
            p.copy_(full)


def init_buffers(model: nn.Module) -> None:
    """Recompute derived buffers (Llama's RoPE tables) after ``to_empty`` left them uninitialised."""
    for module in model.modules():
        if hasattr(module, "init_buffers") and module is not model:
            module.init_buffers()
