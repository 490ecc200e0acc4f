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
    """Compute dtype. bf16/fp16 mean mixed precision with fp32 master weights; fp32 means fp32 throughout;
    fp8 means the linear layers' GEMMs in fp8 with per-tensor scaling (Transformer Engine / torchao style)
    and everything else (attention, norms, activations, communication) in bf16."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """adamw: torch.optim.AdamW (decoupled weight decay); sgd: torch.optim.SGD with momentum (L2 weight decay)."""
    memory_margin: float = 0.1
    """Share of device memory the planner keeps free (allocator fragmentation, NCCL buffers, workspace)."""
    attention: Literal["flash", "standard"] = "flash"
    """``flash``: a fused attention kernel that keeps no s x s scores, only q, k, v, its output and an fp32
    log-sum-exp, and recomputes the scores in backward (FlashAttention on GPUs in bf16/fp16/fp8; in fp32 on a
    GPU torch's memory-efficient kernel, which keeps the same; on CPU torch's flash CPU kernel). It is the
    default everywhere, because torch's SDPA, which the runtime calls, picks such a kernel on every device.
    ``standard``: scores, softmax and dropout as separate kernels that keep the a x s x s tensors for
    backward (Megatron-LM 2021/2022, Korthikanti et al. Table 2)."""
    grad_accumulation_fusion: bool = True
    """The weight-gradient GEMM accumulates straight into the fp32 gradient buffer (Megatron-core's
    ``gradient_accumulation_fusion``, Transformer Engine). False: each micro-batch's weight gradient is
    written in the compute dtype and a separate kernel adds it into the fp32 buffer (Megatron-LM 2021-22's
    ``param.main_grad.add_(param.grad)`` hook, torch's AccumulateGrad): 10 more bytes per parameter moved
    per micro-batch."""
    overlap_grad_reduce: bool = True
    """Data-parallel gradient reduction overlaps the backward pass (DDP buckets / FSDP2 do; Megatron 2021 did not)."""
    learning_rate: float = 3e-4
    min_learning_rate: float = 3e-5
    warmup_steps: int = 10
    decay_steps: int = 1000
    weight_decay: float = 0.1
    """On matrices only (dim >= 2), not on biases and norm weights (nanoGPT's rule)."""
    adam_betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's moment decay rates (beta1, beta2); GPT-3 / Llama pre-training use (0.9, 0.95)."""
    adam_eps: float = 1e-8
    """AdamW's denominator term."""
    sgd_momentum: float = 0.9
    """SGD's momentum factor (0 keeps no momentum buffer)."""
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
        require(len(self.adam_betas) == 2 and all(0 <= b < 1 for b in self.adam_betas), "adam_betas",
                "needs two values in [0, 1), e.g. [0.9, 0.95]")
        require_range(self, "adam_eps", 0.0, 1.0, low_open=True)
        require(0 <= self.sgd_momentum < 1, "sgd_momentum", "must be in [0, 1)")

    @property
    def mixed_precision(self) -> bool:
        return self.precision != "fp32"

    @property
    def activation_precision(self) -> Precision:
        """The dtype of activations, communication and every non-GEMM kernel (fp8 keeps those in bf16)."""
        return "bf16" if self.precision == "fp8" else self.precision
