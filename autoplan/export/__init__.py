"""Handing a plan to the training stack it was made for: a torchtitan job file, Megatron-LM's arguments.

A plan made with ``--stack torchtitan`` (or ``megatron``) is priced for that stack's kernels; ``autoplan
export`` writes it in the stack's own configuration language, so the stack runs the layout that was
priced. What a target cannot express (recomputation that differs between stages where it has one
setting, ZeRO stages it does not have) is refused in one line that names the nearest setting it can run;
nothing is silently rounded. Planning-path code: no torch, no runtime.
"""

from autoplan.export.common import ExportError
from autoplan.export.megatron import megatron_arguments
from autoplan.export.torchtitan import torchtitan_toml

TARGETS = ("torchtitan", "megatron")

__all__ = ["ExportError", "TARGETS", "megatron_arguments", "torchtitan_toml"]
