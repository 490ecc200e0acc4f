"""Finding the repeated blocks of a model: the unit a pipeline stage boundary falls between.

A transformer keeps its blocks in one ``nn.ModuleList`` / ``nn.ModuleDict`` of modules of one class
(``model.blocks``, HF ``model.layers``, timm ``blocks``). We take the container, anywhere in the module
tree, whose children all share one class and which holds the most parameters; that rule also finds the
mixer stack in ``examples/custom_model``. Models without such a container are refused: we would have no
honest way to cut them into pipeline stages.
"""

from __future__ import annotations

import hashlib

from torch import nn

from autoplan.errors import SpecError


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(FQN, module) of each repeated block, in execution order of the container."""
    best: list[tuple[str, nn.Module]] = []
    best_params = -1
    for name, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            continue
        children = list(module.named_children())
        if len(children) < 2 or len({type(c) for _, c in children}) != 1:
            continue
        params = sum(p.numel() for p in module.parameters())
        if params > best_params:
            prefix = f"{name}." if name else ""
            best, best_params = [(prefix + key, child) for key, child in children], params
    if not best:
        raise SpecError(f"{type(model).__name__}: no repeated blocks found; keep the blocks in one "
                        "nn.ModuleList or nn.ModuleDict of modules of one class")
    return best


def block_signature(block: nn.Module) -> str:
    """Class name plus a short hash of the parameter names and shapes: equal for identical blocks."""
    shapes = ";".join(f"{n}:{tuple(p.shape)}" for n, p in block.named_parameters())
    digest = hashlib.sha1(shapes.encode()).hexdigest()[:8]
    return f"{type(block).__name__}-{digest}"
