"""What a pipeline schedule holds of the last stage's output (the logits) while that micro-batch's loss runs
its backward.

torch's ``PipelineStage`` caches every stage's output beside its inputs (``fwd_cache``) until the micro-batch's
backward, even with ``return_outputs=False``, though the last stage's backward starts from the loss. The
runtime's stage (runtime/parallel/pipeline.py ``KeyedStage``) drops it, so the logits die once the loss is
computed, as in a step without pipelining: what the ``autoplan`` stack prices (``pipeline_keeps_outputs``
false, no logits on the last stage beyond the loss's own buffers)."""

import weakref

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from autoplan.cost.activations import kept_output_bytes_per_logit  # noqa: E402
from autoplan.schema import load_stack  # noqa: E402

VOCAB, HIDDEN, SEQ = 64, 16, 8


def probe_loss(alive: list[bool]):
    """A loss whose backward first records whether the output it was computed from is still referenced."""
    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, loss):
            return loss.clone()

        @staticmethod
        def backward(ctx, grad):
            alive.append(ctx.output_ref() is not None)
            return grad

    def loss_fn(output, target):
        ref = weakref.ref(output)
        loss = F.cross_entropy(output.float().flatten(0, 1), target.flatten(0, 1))
        out = Probe.apply(loss)
        out.grad_fn.output_ref = ref  # read in backward through ctx (the node is the ctx)
        return out

    return loss_fn


def scheduled(stage_of) -> list[bool]:
    """Two micro-batches through one stage (F0 F1 B0 B1) under torch's interpreter of action lists, loaded
    as the runtime loads it (runtime/parallel/pipeline.py ``build_pipeline``)."""
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    from runtime.parallel.pipeline import torch_actions

    torch.manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB).to(torch.bfloat16)
    x, y = torch.randn(4, SEQ, HIDDEN, dtype=torch.bfloat16), torch.randint(0, VOCAB, (4, SEQ))
    alive: list[bool] = []
    schedule = _PipelineScheduleRuntime([stage_of(head)], n_microbatches=2, loss_fn=probe_loss(alive))
    schedule._prepare_schedule_with_comms(torch_actions("gpipe", 1, 1, 2))
    schedule.step(x, target=y, losses=[], return_outputs=False)
    return alive


def test_torchs_stage_holds_the_logits_through_the_loss_backward_and_the_runtimes_does_not():
    from torch.distributed.pipelining import PipelineStage

    from runtime.models.dropout import DropoutState
    from runtime.parallel.pipeline import DropoutRows, KeyedStage

    head = torch.nn.Linear(HIDDEN, VOCAB).to(torch.bfloat16)
    plain: list[bool] = []
    probe_loss(plain)(head(torch.randn(4, SEQ, HIDDEN, dtype=torch.bfloat16)), torch.randint(0, VOCAB, (4, SEQ))) \
        .backward()  # the runtime's step without pipelining (runtime/trainer.py)
    assert plain == [False]

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    cpu = torch.device("cpu")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        torchs = scheduled(lambda m: PipelineStage(m, stage_index=0, num_stages=1, device=cpu))
        rows = DropoutRows(DropoutState(seed=0), micro_batch_size=2, replica_first_row=0)
        runtimes = scheduled(lambda m: KeyedStage(m, 0, 1, cpu, rows=rows))
    finally:
        dist.destroy_process_group()
    assert torchs == [True, True]
    assert runtimes == [False, False]
    # what the runtime's stack prices for it: nothing kept on the last stage
    assert kept_output_bytes_per_logit(2, load_stack("autoplan")) == 0.0
