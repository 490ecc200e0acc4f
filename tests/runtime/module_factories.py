"""Factories for the refusal tests of a user's own module (tests/runtime/test_custom_module.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.models.adapter import ModuleAdapter


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def build() -> tuple[nn.Module, torch.Tensor]:
    return Tiny(), torch.zeros(2, 4)


class TinyAdapter(ModuleAdapter):
    """No ``tp_plan``: a plan with tp > 1 is refused."""

    def parts(self, model: Tiny):
        return model.inp, model.blocks, model.out

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target)

    def batch(self, step: int, first_row: int, rows: int, seed: int):
        gen = torch.Generator().manual_seed(seed * 7919 + step)
        x = torch.randn(first_row + rows, 4, generator=gen)[first_row:]
        return x, (x.sum(dim=1) > 0).long()


autoplan_adapter = TinyAdapter()
TINY_PARAMS = sum(p.numel() for p in Tiny().parameters())
