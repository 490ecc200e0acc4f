"""Bytes per parameter of weights, gradients and optimizer state, and how ZeRO divides them.

Rajbhandari et al. 2020 (ZeRO), section 3.1 and Figure 1: mixed-precision Adam keeps 2 bytes of fp16/bf16
weights, 2 of gradients and K = 12 of optimizer state (fp32 master weights, momentum, variance) per
parameter: 16 bytes in all. Stage 1 divides the optimizer state by the data-parallel degree N_d, stage 2
the gradients too, stage 3 the weights too:

    stage 0: (2 + 2 + K) Psi     stage 1: 4 Psi + K Psi / N_d
    stage 2: 2 Psi + (2 + K) Psi / N_d     stage 3: (2 + 2 + K) Psi / N_d

fp32 training keeps 4 + 4 bytes and Adam's two fp32 moments (K = 8). SGD with momentum keeps one moment
(K = 4) plus, in mixed precision, the fp32 master weights (K = 8). Offloading moves the optimizer state
to host memory (ZeRO-Offload), leaving weights and gradients on the device. fp8 training keeps the same
states as bf16: the fp8 weight casts are made on the fly each micro-batch (cost/layer_ops.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.schema import TrainingSetup


@dataclass(frozen=True)
class StateBytes:
    """Device bytes per parameter after ZeRO sharding, by kind."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def optimizer_state_bytes(training: TrainingSetup) -> int:
    """K of the ZeRO paper for this precision and optimizer."""
    if training.optimizer == "adamw":
        return 12 if training.mixed_precision else 8
    return 8 if training.mixed_precision else 4


def state_bytes_per_param(training: TrainingSetup, zero_stage: int, dp: int, offload: bool) -> StateBytes:
    weight = grad = 2 if training.mixed_precision else 4
    k = 0 if offload else optimizer_state_bytes(training)
    return StateBytes(
        weights=weight / dp if zero_stage >= 3 else weight,
        gradients=grad / dp if zero_stage >= 2 else grad,
        optimizer=k / dp if zero_stage >= 1 else k,
    )


ADAMW_FP32_STEP_BYTES = 4 + 8 + 28
"""optimizer_step_bytes of fp32 AdamW with clipping: the step a CPU's ``optimizer_ns_per_param`` is measured on."""


def optimizer_step_bytes(training: TrainingSetup) -> int:
    """Bytes per parameter the end-of-step kernels read and write (all memory-bound), as Megatron-LM's mixed
    precision optimizer and torch's ``clip_grad_norm_`` + AdamW do them, with fp32 gradients and states:

        gradient norm for clipping: read the gradient                                4
        clipping: scale the gradients by the clip coefficient (read, write)         8   (grad_clip > 0)
        AdamW: read gradient, master weight, momentum, variance; write the last 3    28
        SGD with momentum: read gradient, weight, momentum; write the last two       20
        mixed precision: the bf16/fp16 weight copy from the fp32 master (read, write) 6
        fp16: unscale the gradients and check them for inf/nan (read, write)         8
    """
    clip = 4 + 8 if training.grad_clip > 0 else 0
    update = 28 if training.optimizer == "adamw" else 20
    copy = 6 if training.mixed_precision else 0
    unscale = 8 if training.precision == "fp16" else 0
    return clip + update + copy + unscale
