"""A user model that is not in autoplan's zoo: an MLP-Mixer image classifier (Tolstikhin et al. 2021).

Profile it with::

    autoplan profile examples.custom_model.mixer:build --device cpu --micro-batch-sizes 1,4 --tp-sizes 1,2

``build()`` is all autoplan needs: a callable returning ``(module, example_batch)``, batch axis first.
The profiler finds the repeated blocks (``blocks``, an ``nn.ModuleList``), treats the patch embedding as
the embedding layer and the pooling classifier as the head, and finds from the traced graph that each
block's token-mixing and channel-mixing MLPs split for tensor parallelism (fc1 column-wise, fc2 row-wise),
although nothing here says so.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MixerMLP(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MixerBlock(nn.Module):
    """Token mixing (an MLP across patches, per channel), then channel mixing (an MLP per patch)."""

    def __init__(self, tokens: int, channels: int, token_hidden: int, channel_hidden: int) -> None:
        super().__init__()
        self.token_norm = nn.LayerNorm(channels)
        self.token_mlp = MixerMLP(tokens, token_hidden)
        self.channel_norm = nn.LayerNorm(channels)
        self.channel_mlp = MixerMLP(channels, channel_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, tokens, channels]
        x = x + self.token_mlp(self.token_norm(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.channel_norm(x))


class Mixer(nn.Module):
    def __init__(self, image: int = 32, patch: int = 4, channels: int = 64, depth: int = 4,
                 token_hidden: int = 128, channel_hidden: int = 256, classes: int = 10) -> None:
        super().__init__()
        self.patch = patch
        tokens = (image // patch) ** 2
        self.stem = nn.Linear(3 * patch * patch, channels)
        self.blocks = nn.ModuleList(MixerBlock(tokens, channels, token_hidden, channel_hidden)
                                    for _ in range(depth))
        self.norm = nn.LayerNorm(channels)
        self.classifier = nn.Linear(channels, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        b, c, _, _ = images.shape
        p = self.patch
        patches = images.unfold(2, p, p).unfold(3, p, p)            # [B, C, H/p, W/p, p, p]
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(b, -1, c * p * p)  # [B, tokens, C*p*p]
        x = self.stem(patches)
        for block in self.blocks:
            x = block(x)
        return self.classifier(self.norm(x).mean(dim=1))            # [B, classes]


def build() -> tuple[nn.Module, torch.Tensor]:
    """The factory ``autoplan profile`` calls: the model and one example batch of two 32x32 RGB images."""
    return Mixer(), torch.randn(2, 3, 32, 32)
