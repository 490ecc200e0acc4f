"""What every exporter reads off a plan: its recomputation per stage."""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.errors import SpecError
from autoplan.schema import Plan


class ExportError(SpecError):
    """The plan holds something the target stack cannot express; the message names the nearest it can."""


@dataclass(frozen=True)
class StageRecompute:
    layers: int
    full: int
    selective: int


def stage_recompute(plan: Plan) -> list[StageRecompute]:
    return [StageRecompute(s.num_layers, len(s.full_recompute), len(s.selective_recompute)) for s in plan.stages]


def uniform_mode(plan: Plan) -> str | None:
    """"none", "selective" or "full" when every block of every stage does the same; else None."""
    stages = stage_recompute(plan)
    for mode, count in (("none", lambda s: s.full + s.selective == 0), ("full", lambda s: s.full == s.layers),
                        ("selective", lambda s: s.selective == s.layers)):
        if all(count(s) for s in stages):
            return mode
    return None


def describe_recompute(plan: Plan) -> str:
    """'full 3/8, selective 0/8 | full 2/8, ...' per stage, for refusals."""
    return " | ".join(f"full {s.full}/{s.layers} selective {s.selective}/{s.layers}" for s in stage_recompute(plan))
