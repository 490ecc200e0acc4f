"""What is trained and how: batch, sequence, precision, optimizer, and the knobs the runtime needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autoplan.schema._io import require, require_range
from autoplan.schema.hardware import Precision
from autoplan.schema.limits import MAX_BATCH_SIZE, MAX_LEARNING_RATE, MAX_SEED, MAX_SEQ_LEN, MAX_STEPS


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
        # floats are finite (checked on load for every float field); here: the ranges that make sense
        require_range(self, "global_batch_size", 1, MAX_BATCH_SIZE)
        require_range(self, "seq_len", 1, MAX_SEQ_LEN)
        require(0 <= self.memory_margin < 1, "memory_margin", "must be in [0, 1)")
        require_range(self, "learning_rate", 0.0, MAX_LEARNING_RATE, low_open=True)
        require(0 <= self.min_learning_rate <= self.learning_rate, "min_learning_rate",
                f"{self.min_learning_rate} must be in [0, learning_rate = {self.learning_rate}]")
        require_range(self, "warmup_steps", 0, MAX_STEPS)
        require_range(self, "decay_steps", 1, MAX_STEPS)
        require_range(self, "weight_decay", 0.0, 10.0)
        require_range(self, "grad_clip", 0.0, 1e6)  # 0 disables clipping
        require_range(self, "seed", 0, MAX_SEED)

    @property
    def mixed_precision(self) -> bool:
        return self.precision != "fp32"
