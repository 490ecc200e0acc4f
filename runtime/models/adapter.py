"""Your own ``nn.Module`` under a plan: the adapter protocol.

``autoplan profile package.module:build`` profiles any module; to plan it with ``-o`` and train it with
``autoplan run``, the factory's module also defines ``autoplan_adapter``, an instance of a subclass of
``ModuleAdapter`` that tells the runtime what it cannot find out by itself:

* ``parts(model)`` -- the module cut in three: ``embed`` (the input batch -> the hidden tensor the blocks
  pass on; None if there is nothing before the blocks), ``blocks`` (an ``nn.ModuleList`` or
  ``nn.ModuleDict`` of same-class modules, hidden -> hidden: the plan's pipeline-stage units, the ones
  the profiler found) and ``head`` (hidden -> output; None if nothing). The runtime runs
  ``head(blocks[-1](... blocks[0](embed(inputs))))``, which must be what the module computes: its own
  ``forward`` is not called. The embed part runs on the first pipeline stage, the head on the last.
* ``loss(output, target)`` -- the mean loss of a batch of rows (a mean, so that micro-batches and
  data-parallel replicas average to the serial run's loss).
* ``batch(step, first_row, rows, seed)`` -- rows ``first_row .. first_row + rows - 1`` of step ``step``'s
  global batch, as ``(inputs, targets)`` tensors with the batch axis first. It must be a pure function of
  (seed, step, row): every layout then trains on the serial run's rows (each data-parallel replica asks
  for its own rows). Synthetic data or your own data set, indexed by row.
* ``tp_plan(block)`` (optional) -- the block's tensor-parallel plan in torch's terms, a
  ``{submodule name: ParallelStyle}`` dict for ``parallelize_module`` (``ColwiseParallel``,
  ``RowwiseParallel``...); without it a plan with tp > 1 is refused.

What the runtime then does with it (runtime/module_build.py): every stage is built from the factory on the
meta device, keeps its blocks (``blocks.<global index>``, so parameter names do not depend on the layout),
gets TP per block, full recomputation per block, FSDP2 / replicate for ZeRO 0-3, and is materialised.
Initial values: the factory's own initialisation, run once per rank on the whole module on the CPU under
``torch.manual_seed(training.seed)``; each rank copies its shards of every tensor (by canonical name). So
your ``__init__`` / ``reset_parameters`` define the values, and they do not depend on the layout -- at the
cost of building the whole module once per rank on the host (fine for a module that fits one host's
memory; the reference models draw each parameter from its own generator instead, runtime/models/init.py).

Not for your module: context and sequence parallelism (the runtime does not know the module's sequence
axis), selective recomputation (the reference models' attention core), tied parameters across pipeline
stages. Dropout: your module's dropout draws from torch's generator on each rank, so a multi-rank run's
masks differ from the serial run's (the reference models seed masks by element position,
runtime/models/dropout.py): with dropout the losses are equal in distribution, not step by step.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autoplan.errors import SpecError

ADAPTER_ATTRIBUTE = "autoplan_adapter"
"""The name the factory's module defines its adapter under."""


class ModuleAdapter:
    """Subclass it beside your factory and define ``autoplan_adapter = YourAdapter()`` (see the module docstring)."""

    def parts(self, model: nn.Module) -> tuple[nn.Module | None, nn.ModuleList | nn.ModuleDict, nn.Module | None]:
        """``(embed, blocks, head)`` of the whole module the factory built."""
        raise NotImplementedError

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The mean loss over the rows of ``output``."""
        raise NotImplementedError

    def batch(self, step: int, first_row: int, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``[first_row, first_row + rows)`` of step ``step``'s global batch: ``(inputs, targets)``."""
        raise NotImplementedError

    def tp_plan(self, block: nn.Module) -> dict[str, Any] | None:
        """``{submodule: ParallelStyle}`` for one block, or None: the module has no tensor-parallel plan."""
        return None


class StageModule(nn.Module):
    """One pipeline stage of a user's module: its embed part (first stage), its blocks keyed by global
    index, its head (last stage). The attribute names are the reference models' (``embed``, ``blocks``,
    ``head``), which the recomputation and data-parallel transforms rely on."""

    def __init__(self, embed: nn.Module | None, blocks: dict[str, nn.Module], head: nn.Module | None) -> None:
        super().__init__()
        self.embed = embed
        self.blocks = nn.ModuleDict(blocks)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks.values():
            x = block(x)
        return self.head(x) if self.head is not None else x


def load_factory(factory: str) -> tuple[Any, ModuleAdapter]:
    """The factory callable and the adapter beside it; one line naming what is missing."""
    module_name, _, attr = factory.partition(":")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        where = importlib.import_module(module_name)
        build = getattr(where, attr)
    except (ImportError, AttributeError) as err:
        raise SpecError(f"module.factory: cannot import {factory} ({err}); run where the package imports") from None
    adapter = getattr(where, ADAPTER_ATTRIBUTE, None)
    if not isinstance(adapter, ModuleAdapter):
        raise SpecError(f"module.factory: {module_name} defines no {ADAPTER_ATTRIBUTE} (an instance of a "
                        "runtime.models.adapter.ModuleAdapter subclass); see examples/custom_model/README.md")
    return build, adapter


def build_whole(build: Any, factory: str) -> nn.Module:
    """The factory's module (in the current default device context)."""
    result = build()
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module)):
        raise SpecError(f"module.factory: {factory} must return (module, example_batch)")
    return result[0]


def split(model: nn.Module, adapter: ModuleAdapter, factory: str) -> tuple[nn.Module | None, list[nn.Module],
                                                                           nn.Module | None]:
    """The adapter's three parts, checked: blocks as a list in order."""
    embed, blocks, head = adapter.parts(model)
    if not isinstance(blocks, (nn.ModuleList, nn.ModuleDict)):
        raise SpecError(f"module.factory: {factory}'s adapter parts() must give its blocks as an nn.ModuleList "
                        f"or nn.ModuleDict, got {type(blocks).__name__}")
    return embed, list(blocks.values() if isinstance(blocks, nn.ModuleDict) else blocks), head


def stage_module(model: nn.Module, adapter: ModuleAdapter, factory: str, layers: range | None, first: bool,
                 last: bool) -> StageModule:
    """The stage holding ``layers`` (None: every block), with the embed part if ``first`` and the head if ``last``."""
    embed, blocks, head = split(model, adapter, factory)
    keep = range(len(blocks)) if layers is None else layers
    return StageModule(embed if first else None, {str(i): blocks[i] for i in keep}, head if last else None)


def count_params(model: nn.Module) -> int:
    """Parameters counted once (shared ones once), as the profiler counts them."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def shared_across(stage_parts: list[nn.Module]) -> bool:
    """Whether two of the parts hold the same parameter (a tied embedding and head)."""
    seen: set[int] = set()
    for part in stage_parts:
        ids = {id(p) for p in part.parameters()}
        if ids & seen:
            return True
        seen |= ids
    return False
