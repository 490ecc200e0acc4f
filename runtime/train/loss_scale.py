"""Dynamic loss scaling for fp16 plans: the loss is multiplied by a scale before backward so small
gradients survive fp16, the gradients are divided by it before clipping, and a step whose gradients
overflowed is skipped. The rule is torch.amp.GradScaler's: halve the scale on an overflow, double it after
``growth_interval`` steps in a row without one.

Why our own rather than GradScaler or FSDP's ShardedGradScaler: a step must be skipped on every rank or on
none, and a rank's gradients are DTensors on several meshes (TP, FSDP) beside plain tensors, on pipeline
ranks that hold different parameters. GradScaler checks each rank's own gradients. The global gradient
norm that ``clip_grad_norm`` (runtime/train/optim.py) takes with one all-reduce over the world is finite on
every rank or on none, so it decides, at no extra collective.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class LossScale:
    def __init__(self, enabled: bool, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> None:
        self.enabled = enabled
        self.value = init_scale if enabled else 1.0
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.good_steps = 0
        self.skipped = 0
        """Steps skipped for overflow so far (reported in the metrics)."""

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.value if self.enabled else loss

    def unscale_(self, params: list[nn.Parameter]) -> None:
        if not self.enabled:
            return
        inv = 1.0 / self.value
        for p in params:
            if p.grad is not None:
                p.grad.mul_(inv)

    def update(self, grad_norm: float) -> bool:
        """After unscaling and the global norm: whether to take the optimizer step; adjusts the scale."""
        if not self.enabled:
            return True
        if not math.isfinite(grad_norm):
            self.value *= self.backoff_factor
            self.good_steps = 0
            self.skipped += 1
            return False
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.value *= self.growth_factor
            self.good_steps = 0
        return True
