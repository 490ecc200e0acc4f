"""Under pipelining torch's schedule holds the last stage's output (the logits) until that micro-batch's
backward, even with ``return_outputs=False`` (what the runtime passes): the stage caches it beside its inputs
(``fwd_cache``) and holds it through the loss's backward. Without pipelining nothing does, since the loss
keeps its fp32 log-softmax, not the logits. So the ``autoplan`` stack counts e bytes a logit more on the last
stage under pipelining (``StackProfile.pipeline_holds_outputs``, cost/activations.py
``held_output_bytes_per_logit``), and this test is what says so."""

import weakref

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from autoplan.cost.activations import held_output_bytes_per_logit  # noqa: E402
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


def test_the_schedule_holds_the_output_through_the_loss_backward_and_a_plain_step_does_not():
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    torch.manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB).to(torch.bfloat16)
    x, y = torch.randn(4, SEQ, HIDDEN, dtype=torch.bfloat16), torch.randint(0, VOCAB, (4, SEQ))

    plain: list[bool] = []
    loss_fn = probe_loss(plain)
    loss_fn(head(x), y).backward()  # the runtime's step without pipelining (runtime/trainer.py)
    assert plain == [False]

    held: list[bool] = []
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        stage = PipelineStage(head, stage_index=0, num_stages=1, device=torch.device("cpu"))
        schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=probe_loss(held))
        schedule.step(x, target=y, losses=[], return_outputs=False)
    finally:
        dist.destroy_process_group()
    assert held == [True, True]
    # what the stacks count for it: e bytes a logit on the runtime's stack, none on Megatron's
    assert held_output_bytes_per_logit(2, load_stack("autoplan")) == 2.0
    assert held_output_bytes_per_logit(2, load_stack("megatron")) == 0.0
