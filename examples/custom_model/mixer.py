"""A user model that is not in autoplan's zoo: an MLP-Mixer image classifier (Tolstikhin et al. 2021).

Profile it with::

    autoplan profile examples.custom_model.mixer:build --device cpu --micro-batch-sizes 1,4 --tp-sizes 1,2

``build()`` is all ``autoplan profile`` needs: a callable returning ``(module, example_batch)``, batch
axis first. The profiler finds the repeated blocks (``blocks``, an ``nn.ModuleList``), treats the patch
embedding as the embedding layer and the pooling classifier as the head, and finds from the traced graph
that each block's token-mixing and channel-mixing MLPs split for tensor parallelism (fc1 column-wise, fc2
row-wise), although nothing here says so.

``autoplan_adapter`` (a ``runtime.models.adapter.ModuleAdapter``) is what ``autoplan plan -o`` and
``autoplan run`` need besides: the module's three parts, its loss, a seeded data source and its TP plan::

    autoplan plan mixer.yaml --cluster cpu-local --devices-per-node 4 --global-batch-size 8 --rescale-profile -o plan.yaml
    autoplan run plan.yaml --steps 5
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from runtime.models.adapter import ModuleAdapter


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


class PatchEmbed(nn.Module):
    """Images [B, 3, H, W] -> one vector per p x p patch [B, tokens, channels]."""

    def __init__(self, patch: int, channels: int) -> None:
        super().__init__()
        self.patch = patch
        self.stem = nn.Linear(3 * patch * patch, channels)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        b, c, _, _ = images.shape
        p = self.patch
        patches = images.unfold(2, p, p).unfold(3, p, p)            # [B, C, H/p, W/p, p, p]
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(b, -1, c * p * p)  # [B, tokens, C*p*p]
        return self.stem(patches)


class ClassifierHead(nn.Module):
    """[B, tokens, channels] -> class logits [B, classes]: norm, mean over patches, linear."""

    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels)
        self.classifier = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.norm(x).mean(dim=1))


class Mixer(nn.Module):
    def __init__(self, image: int = 32, patch: int = 4, channels: int = 64, depth: int = 4,
                 token_hidden: int = 128, channel_hidden: int = 256, classes: int = 10) -> None:
        super().__init__()
        tokens = (image // patch) ** 2
        self.embed = PatchEmbed(patch, channels)
        self.blocks = nn.ModuleList(MixerBlock(tokens, channels, token_hidden, channel_hidden)
                                    for _ in range(depth))
        self.head = ClassifierHead(channels, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(images)
        for block in self.blocks:
            x = block(x)
        return self.head(x)                                         # [B, classes]


def build() -> tuple[nn.Module, torch.Tensor]:
    """The factory ``autoplan profile`` calls: the model and one example batch of two 32x32 RGB images."""
    return Mixer(), torch.randn(2, 3, 32, 32)


class MixerAdapter(ModuleAdapter):
    """What ``autoplan plan -o`` and ``autoplan run`` need besides ``build`` (runtime/models/adapter.py)."""

    classes = 10

    def parts(self, model: Mixer):
        return model.embed, model.blocks, model.head

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target)

    def batch(self, step: int, first_row: int, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Synthetic images, each drawn from its own generator seeded by (seed, step, row), so any data-parallel
        replica draws exactly the serial run's rows; the label is the brightest of ten image regions (learnable)."""
        images = []
        for row in range(first_row, first_row + rows):
            gen = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1_000_003 + row) % 2**63)
            images.append(torch.randn(3, 32, 32, generator=gen))
        x = torch.stack(images)
        regions = x.mean(dim=1).flatten(1)[:, :1020].reshape(rows, self.classes, -1).mean(dim=2)  # [rows, 10]
        return x, regions.argmax(dim=1)

    def tp_plan(self, block: MixerBlock) -> dict:
        """Megatron's MLP split in both mixing MLPs: fc1 column-wise (its hidden units spread over the TP ranks),
        fc2 row-wise (partial sums all-reduced); the norms stay whole on every rank."""
        return {"token_mlp.fc1": ColwiseParallel(), "token_mlp.fc2": RowwiseParallel(),
                "channel_mlp.fc1": ColwiseParallel(), "channel_mlp.fc2": RowwiseParallel()}


autoplan_adapter = MixerAdapter()
