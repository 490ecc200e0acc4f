"""Pipeline parallelism: the plan's stages, and the plan's own action lists run by torch's interpreter.

Stage ``i`` runs on the pipeline rank the plan's schedule places it on (``stage_rank``,
autoplan/schema/schedule.py) and is built alone (runtime/build.py):
its blocks keep their global keys ("5"), so its parameter names are the full model's.

One schedule source: the per-rank compute lists come from ``autoplan.schema.schedule.build_schedule``
-- the very lists the cost model simulates -- and are handed to torch.distributed.pipelining's
``_PipelineScheduleRuntime`` (``_prepare_schedule_with_comms``: torch's lowering passes add the sends,
receives, FSDP unshard/reshard and the once-per-step gradient reduction, then its interpreter runs
them). So the executed compute order equals the simulated one for every schedule: GPipe, 1F1B,
interleaved 1F1B and the zero-bubble ones, whose split backwards are torch's BACKWARD_INPUT and
BACKWARD_WEIGHT actions (stage.py ``backward_one_chunk(full_backward=False)`` keeps the graph for
``backward_weight_one_chunk``), and whose V placement torch derives from the lists
(``_validate_schedule``: the rank that runs a stage's actions holds it).
Why the private class: torch 2.13 exposes running a caller's action list only there (``_load_csv``
reads the same lists from a file); its public GPipe/1F1B classes keep their own hand-written loops.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _Action, _ComputationType, _PipelineScheduleRuntime

from autoplan.schema import Plan
from autoplan.schema.schedule import build_schedule
from runtime.mesh import ParallelMesh
from runtime.models.dropout import DropoutState
from runtime.models.moe import moe_layers

KINDS = {"F": _ComputationType.FORWARD, "B": _ComputationType.FULL_BACKWARD, "I": _ComputationType.BACKWARD_INPUT,
         "W": _ComputationType.BACKWARD_WEIGHT}


@dataclass(frozen=True)
class DropoutRows:
    """Where micro-batch ``chunk`` of this replica sits in the global batch, for the dropout state."""

    state: DropoutState
    micro_batch_size: int
    replica_first_row: int
    """Global batch row of this data-parallel replica's first sequence."""

    def at(self, chunk: int) -> None:
        self.state.first_row = self.replica_first_row + chunk * self.micro_batch_size


@contextlib.contextmanager
def kept_expert_loads(module: nn.Module):
    """Restore the MoE layers' ``tokens_per_expert`` counters of ``module`` on exit."""
    counters = [m.tokens_per_expert for m in moe_layers(module)]
    saved = [c.clone() for c in counters]
    try:
        yield
    finally:
        for counter, value in zip(counters, saved):
            counter.copy_(value)


class KeyedStage(PipelineStage):
    """A PipelineStage that tells the dropout state which micro-batch it is computing, so that masks
    are seeded by global row (runtime/models/dropout.py), also when a backward recomputes a forward; and
    that, on the last stage, does not keep the model's output (the logits) until the micro-batch's backward.

    Where torch's stage falls short: ``forward_one_chunk`` caches every stage's output in ``fwd_cache`` beside
    its inputs for the backward, but the last stage's backward starts from the loss (``backward_one_chunk``:
    ``stage_output=loss`` when ``is_last``) and never reads it. Kept, the e-byte logits of every micro-batch in
    flight there outlive the loss, which saves its own fp32 copy; dropped, they die once the schedule has
    computed the loss, as Megatron's schedules free them. tests/runtime/test_pipeline_held_output.py checks
    both; with ``step(return_outputs=False)`` (runtime/trainer.py) the last stage keeps no output, which is
    what the ``autoplan`` stack prices (``StackProfile.pipeline_keeps_outputs`` false)."""

    def __init__(self, *args, rows: DropoutRows, **kwargs):
        super().__init__(*args, **kwargs)
        self.rows = rows

    def _at(self, chunk: int) -> None:
        self.rows.at(chunk)

    def _forward_metadata_inference(self, *args, **kwargs):
        """torch runs each stage's forward (and, for the backward's shapes, its backward, which reruns the
        forward of recomputed blocks) once before the first step (stage.py ``_forward_metadata_inference``,
        ``_backward_metadata_inference``), on the first micro-batch or on tensors made from metadata. That
        is not training: the MoE layers' expert-load counters (the sigmoid router's bias rule,
        expert_parallel.py ``update_expert_bias``) are put back as they were, or the first bias update would
        count tokens the serial run never routes."""
        with kept_expert_loads(self.submod):
            return super()._forward_metadata_inference(*args, **kwargs)

    def _backward_metadata_inference(self, *args, **kwargs):
        with kept_expert_loads(self.submod):
            return super()._backward_metadata_inference(*args, **kwargs)

    def forward_one_chunk(self, fwd_chunk_id: int, *args, **kwargs):
        self._at(fwd_chunk_id)
        output = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        if self.is_last and fwd_chunk_id in self.fwd_cache:  # the schedule computes the loss from ``output``
            _, inputs = self.fwd_cache[fwd_chunk_id]
            self.fwd_cache[fwd_chunk_id] = ((), inputs)
        return output

    def backward_one_chunk(self, bwd_chunk_id: int, *args, **kwargs):
        self._at(bwd_chunk_id)
        return super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)


def torch_actions(schedule: str, pp: int, virtual_stages: int, num_microbatches: int) -> dict[int, list[_Action]]:
    """The plan's per-rank compute lists as torch's schedule IR ("2F0" -> _Action(2, FORWARD, 0))."""
    orders = build_schedule(schedule, pp, virtual_stages, num_microbatches)
    return {rank: [_Action(a.stage, KINDS[a.kind], a.microbatch) for a in actions] for rank, actions in orders.items()}


def build_pipeline(plan: Plan, stage_models: dict[int, nn.Module], pm: ParallelMesh, loss_fn: Callable,
                   rows: DropoutRows) -> _PipelineScheduleRuntime:
    """A PipelineStage per local stage model (``stage_models``: stage index -> its module) on the plan's
    pipeline group, and torch's interpreter loaded with the plan's lists."""
    stages = [KeyedStage(m, i, plan.num_stages, pm.device, group=pm.group("pp"), rows=rows)
              for i, m in stage_models.items()]
    # scale_grads=True: each micro-batch loss is a mean and grads are divided by the micro-batch count,
    # so the step's gradient is the mean over the replica's batch, as in the serial run
    runtime = _PipelineScheduleRuntime(stages, n_microbatches=plan.num_microbatches, loss_fn=loss_fn, scale_grads=True)
    runtime._prepare_schedule_with_comms(torch_actions(plan.schedule, plan.pp, plan.virtual_stages,
                                                       plan.num_microbatches))
    return runtime
