"""What is trained and how: batch, sequence, precision, optimizer, and the knobs the runtime needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autoplan.schema._io import require
from autoplan.schema.hardware import Precision


@dataclass(frozen=True)
class TrainingSetup:
    global_batch_size: int
    """Sequences per optimizer step, summed over data-parallel replicas and micro-batches."""
    seq_len: int
    precision: Precision = "bf16"
    """Compute dtype. bf16/fp16 mean mixed precision with fp32 master weights; fp32 means fp32 throughout."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    memory_margin: float = 0.1
    """Share of device memory the planner keeps free (allocator fragmentation, NCCL buffers, workspace)."""
    flash_attention: bool = True
    """Fused attention that keeps no s x s score matrix for backward (PyTorch SDPA flash/memory-efficient)."""
    overlap_grad_reduce: bool = True
    """Data-parallel gradient reduction overlaps the backward pass (DDP buckets / FSDP2 do; Megatron 2021 did not)."""
    learning_rate: float = 3e-4
    min_learning_rate: float = 3e-5
    warmup_steps: int = 10
    decay_steps: int = 1000
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        require(self.global_batch_size >= 1, "global_batch_size", "must be at least 1")
        require(self.seq_len >= 1, "seq_len", "must be at least 1")
        require(0 <= self.memory_margin < 1, "memory_margin", "must be in [0, 1)")
        require(self.learning_rate > 0, "learning_rate", "must be positive")
        require(self.warmup_steps >= 0 and self.decay_steps >= 1, "warmup_steps", "need warmup >= 0, decay >= 1")
        require(self.grad_clip >= 0, "grad_clip", "must be >= 0 (0 disables clipping)")

    @property
    def mixed_precision(self) -> bool:
        return self.precision != "fp32"
