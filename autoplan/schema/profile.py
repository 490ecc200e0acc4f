"""The model profile: what ``autoplan profile`` measured of a model, layer by layer, per micro-batch size.

A profile lets the planner plan a model it has no formulas for (a Hugging Face config, a user's own
module): the tracer has counted each layer's parameters, forward FLOPs, the bytes autograd keeps for
backward and the bytes a pipeline stage would send, and found which linear layers split for tensor
parallelism; on a real device it also timed each distinct block.

Naming: a *layer* is what a pipeline stage boundary can fall between: the ``embedding`` (everything the
model runs before its first repeated block), each ``block`` (one element of the repeated module list), and
the ``head`` (everything after the last block: final norm, output projection). ``block_type`` tells
repeated blocks apart (the class name plus the parameter shapes, as a short signature) so that the planner
can check they are identical. All byte counts are for one micro-batch on one unsharded device; FLOPs
count a multiply-add as 2, attention scores in full (not halved for the causal mask). Bytes are at the
profile's ``dtype``; the planner scales activation bytes to the plan's precision, and GEMM shapes and FLOPs
do not depend on it, so one profile plans for any precision.

This module must not import torch: the planner reads profiles without it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from autoplan.schema._io import dump_yaml, load_yaml, read_yaml, require, require_physical, require_range
from autoplan.schema.limits import MAX_BATCH_SIZE, MAX_DEVICES_PER_NODE, MAX_HIDDEN_SIZE, MAX_PARAMS, MAX_SEQ_LEN

PROFILE_VERSION = 2
ProfileDtype = Literal["bf16", "fp16", "fp32"]
"""The dtypes a model can be profiled in (fp8 plans come from a bf16 or fp32 profile)."""
LayerKind = Literal["embedding", "block", "head"]
AttentionMemory = Literal["measured", "flash-emulated", "math"]
"""How the attention core's saved bytes were obtained: ``measured`` = the real device's SDPA kernel ran;
``flash-emulated`` = traced on meta with SDPA replaced by a function that keeps what a flash kernel keeps
(q, k, v, output and the fp32 log-sum-exp); ``math`` = traced on meta with the math SDPA, which keeps the
s x s probability matrix."""


@dataclass(frozen=True)
class TpSplit:
    """Linears that split column-wise (``columns``, output features sharded) feeding one linear that splits
    row-wise (``row``, input features sharded): Megatron's attention (q, k, v -> o) and MLP (fc1 -> fc2)
    pattern. Names are relative to the layer. Between them there are only element-wise and attention ops,
    so one all-reduce after ``row`` is the only communication."""

    columns: tuple[str, ...]
    row: str


@dataclass(frozen=True)
class GemmShape:
    """``count`` GEMMs C[m, n] = A[m, k] B[k, n] with a parameter operand (the layer's linear layers)."""

    m: int
    n: int
    k: int
    count: int = 1


@dataclass(frozen=True)
class AttentionShape:
    """The attention core of the layer: ``batch_heads`` = batch x (query) heads, causal as in a decoder LM."""

    batch_heads: int
    seq_len: int
    head_dim: int


@dataclass(frozen=True)
class TpShard:
    """One rank's share of the layer with its TP splits sharded ``tp`` ways (the column linears keep
    1/tp of their output features, the row linears 1/tp of their input features), traced at that shape;
    communication excluded. Times are None where not measured."""

    tp: int
    params: int
    fwd_flops: int
    saved_activation_bytes: int
    fwd_time_s: float | None = None
    bwd_time_s: float | None = None
    gemms: tuple[GemmShape, ...] = ()
    attention: AttentionShape | None = None
    attention_flops: int = 0
    elementwise_bytes: int = 0
    elementwise_kernels: int = 0
    eager_bytes: tuple[float, float] | None = None
    """(forward, backward) bytes the shard's eager ops move, as ``LayerMeasurement.eager_bytes`` counts them."""

    def validate(self) -> None:
        require_range(self, "tp", 1, MAX_DEVICES_PER_NODE)
        require_range(self, "params", 0, MAX_PARAMS)
        require_physical(self)  # flops, bytes and times >= 0
        require(self.eager_bytes is None or all(b >= 0 for b in self.eager_bytes), "eager_bytes",
                "two byte counts >= 0: forward, backward")


@dataclass(frozen=True)
class LayerMeasurement:
    """One layer at one micro-batch size."""

    micro_batch_size: int
    fwd_flops: int
    saved_activation_bytes: int
    """Bytes autograd keeps for backward (deduplicated by storage, parameters excluded)."""
    output_bytes: int
    """Bytes of the activation the layer hands to the next one (what a pipeline stage sends)."""
    fwd_time_s: float | None = None
    bwd_time_s: float | None = None
    tp_shards: tuple[TpShard, ...] = ()
    """The layer at each TP size > 1 of the profile that its splits allow."""
    gemms: tuple[GemmShape, ...] = ()
    """The linear layers' GEMMs (what the cost model prices on its GEMM curve)."""
    attention: AttentionShape | None = None
    attention_flops: int = 0
    """FLOPs of the attention core (scores and attention-over-V, in full), part of ``fwd_flops``."""
    elementwise_bytes: int = 0
    """Bytes the memory-bound ops read and write in the forward, fused between GEMMs (op_classes.py)."""
    elementwise_kernels: int = 0
    host_ops: tuple[int, int, int, int] | None = None
    """(forward compute ops, forward views, backward compute ops, backward views) of the layer's eager ops as
    a ``TorchDispatchMode`` counts them, GEMM and attention calls apart (profiler/eager_work.py); what a stack
    that runs the layer op by op pays host time for. None: not counted (a profile written before)."""
    eager_bytes: tuple[float, float] | None = None
    """(forward, backward) bytes the layer's eager compute ops read and write that grow with the tokens (an
    eager stack's memory-bound traffic, cost/layer_ops.py), at the profile's dtype. None: not counted."""

    def shard(self, tp: int) -> TpShard | None:
        return next((s for s in self.tp_shards if s.tp == tp), None)

    def validate(self) -> None:
        require_range(self, "micro_batch_size", 1, MAX_BATCH_SIZE)
        require_physical(self)  # flops, bytes and times >= 0
        require(self.host_ops is None or all(0 <= n <= MAX_PARAMS for n in self.host_ops), "host_ops",
                "four counts >= 0: forward ops, forward views, backward ops, backward views")
        require(self.eager_bytes is None or all(b >= 0 for b in self.eager_bytes), "eager_bytes",
                "two byte counts >= 0: forward, backward")


@dataclass(frozen=True)
class LayerProfile:
    name: str
    """Module path of the block (``blocks.3``), or ``embedding`` / ``head``."""
    kind: LayerKind
    block_type: str
    params: int
    """Parameters first used by this layer (a tied head weight counts once, in the embedding)."""
    param_bytes: int
    tp_splits: tuple[TpSplit, ...]
    measurements: tuple[LayerMeasurement, ...]
    """One per micro-batch size of the profile, in the same order."""
    param_tensors: int = 0
    """Parameter tensors first used by the layer (the optimizer steps them one by one)."""
    tp_param_tensors: int = 0
    """Of those, the ones tensor parallelism splits (the linears of ``tp_splits``; a vocabulary table)."""

    def validate(self) -> None:
        require_range(self, "params", 0, MAX_PARAMS)
        require_range(self, "param_bytes", 0, 16 * MAX_PARAMS)
        require_range(self, "param_tensors", 0, MAX_PARAMS)
        require_range(self, "tp_param_tensors", 0, self.param_tensors if self.param_tensors else MAX_PARAMS)

    def measurement(self, micro_batch_size: int) -> LayerMeasurement:
        for m in self.measurements:
            if m.micro_batch_size == micro_batch_size:
                return m
        sizes = ", ".join(str(m.micro_batch_size) for m in self.measurements)
        raise KeyError(f"micro-batch size {micro_batch_size} not profiled (profiled: {sizes})")


@dataclass(frozen=True)
class ModelProfile:
    name: str
    source: str
    """What was profiled: a shipped model name, a spec or config.json path, or ``module:factory``."""
    device: str
    """Where times and saved bytes were measured: ``meta`` (nothing timed), ``cpu`` or ``cuda``."""
    device_name: str
    """The device model (CPU model name or ``torch.cuda.get_device_name``); the planner compares it."""
    dtype: ProfileDtype
    seq_len: int | None
    """Tokens per sequence; None for a model whose example input has no sequence axis."""
    micro_batch_sizes: tuple[int, ...]
    tp_sizes: tuple[int, ...]
    torch_version: str
    attention_memory: AttentionMemory
    total_params: int
    layers: tuple[LayerProfile, ...]
    tied_params: int = 0
    """Parameters the head uses but the embedding owns (a tied output projection)."""
    hidden_size: int | None = None
    """Width of the block output's last axis, when the blocks pass a [b, s, h] tensor."""
    version: int = PROFILE_VERSION

    def validate(self) -> None:
        require(self.version == PROFILE_VERSION, "version", f"expected {PROFILE_VERSION}; re-run autoplan profile")
        require(len(self.micro_batch_sizes) >= 1, "micro_batch_sizes", "profile at least one micro-batch size")
        require(all(1 <= b <= MAX_BATCH_SIZE for b in self.micro_batch_sizes), "micro_batch_sizes",
                f"each must be in [1, {MAX_BATCH_SIZE}]")
        require(len(set(self.micro_batch_sizes)) == len(self.micro_batch_sizes), "micro_batch_sizes",
                "must be distinct")
        require(all(1 <= t <= MAX_DEVICES_PER_NODE for t in self.tp_sizes), "tp_sizes",
                f"each must be in [1, {MAX_DEVICES_PER_NODE}]")
        require_range(self, "seq_len", 1, MAX_SEQ_LEN)
        require_range(self, "hidden_size", 1, MAX_HIDDEN_SIZE)
        require_range(self, "total_params", 0, MAX_PARAMS)
        require_range(self, "tied_params", 0, MAX_PARAMS)
        require(len(self.layers) >= 1, "layers", "a profile needs at least one layer")
        require(sum(layer.params for layer in self.layers) == self.total_params, "total_params",
                "must equal the sum of the layers' params")
        for i, layer in enumerate(self.layers):
            sizes = tuple(m.micro_batch_size for m in layer.measurements)
            require(sizes == self.micro_batch_sizes, f"layers[{i}].measurements",
                    f"micro-batch sizes {sizes} differ from micro_batch_sizes {self.micro_batch_sizes}")

    @property
    def blocks(self) -> tuple[LayerProfile, ...]:
        return tuple(layer for layer in self.layers if layer.kind == "block")

    def layer(self, kind: LayerKind) -> LayerProfile | None:
        """The embedding or the head (None if the model has none)."""
        return next((layer for layer in self.layers if layer.kind == kind), None)


def load_profile(path: str | os.PathLike) -> ModelProfile:
    """Strict load: unknown keys, missing fields and mismatched micro-batch lists are one-line SpecErrors."""
    return load_yaml(ModelProfile, path)


def dump_profile(profile: ModelProfile) -> str:
    header = (f"# autoplan model profile of {profile.name} ({profile.source}) on {profile.device}"
              f" ({profile.device_name}), {profile.dtype}, torch {profile.torch_version}\n"
              "# Plan from it with: autoplan plan <this file> --cluster ...\n")
    return dump_yaml(profile, header)


def is_profile_file(path: str | os.PathLike) -> bool:
    """Whether a YAML file is a model profile (it has ``layers`` and ``total_params``), without loading it
    strictly; the planner uses this to accept a profile in place of a model spec."""
    data = read_yaml(path)
    return isinstance(data, dict) and "layers" in data and "total_params" in data
