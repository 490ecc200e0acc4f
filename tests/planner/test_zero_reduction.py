"""How often gradients are reduced, as the runtime reduces them.

ZeRO 2 and 3 keep only gradient shards between micro-batches, so every micro-batch's backward reduce-scatters
its layers' gradients (runtime/parallel/data_parallel.py ``set_microbatch_sync``: FSDP2 with gradient sync on
for every micro-batch; torchtitan's gradient accumulation does the same). ZeRO 0 and 1 reduce once, after the
last micro-batch, and so does a pipelined stage on a stack whose schedule runtime accumulates a stage's
gradients whole (``pipeline_reduces_once``). A model that priced one reduction per step for ZeRO 2/3 called
large data-parallel layouts with many micro-batches nearly free of gradient traffic; these tests hold the
count to the runtime's.
"""

import dataclasses

import pytest

from autoplan.cost.comm import collective_time_s, group_link
from autoplan.cost.estimate import estimate_layout, layout_of, split_of
from autoplan.cost.evaluate import StageShape
from autoplan.cost.model_workload import workload_fn
from autoplan.cost.stage_table import Config, device_table, ns
from autoplan.schema import Link, TrainingSetup, load_cluster, load_model

MODEL = load_model("llama3-8b")
# two nodes on a slow network: a block's fp32 gradient reduce-scatter over 16 ranks outlasts its backward
CLUSTER = dataclasses.replace(load_cluster("dgx-h100-80gb"), num_nodes=2, inter_node=Link(2.0, 10.0))


def predict(zero: int, m: int, pp: int = 1, overlap: bool = True):
    dp = CLUSTER.num_devices // pp
    training = TrainingSetup(global_batch_size=dp * m, seq_len=2048, memory_margin=0.0, overlap_grad_reduce=overlap)
    config = Config(tp=1, pp=pp, dp=dp, cp=1, sequence_parallel=False, zero_stage=zero, offload_optimizer=False,
                    schedule="1f1b", virtual_stages=1, micro_batch_size=1, num_microbatches=m)
    per_stage = MODEL.num_layers // pp
    layout = layout_of(config, tuple(StageShape(per_stage) for _ in range(pp)))
    fn = workload_fn(MODEL, CLUSTER, training)
    predicted, _, table = estimate_layout(fn, CLUSTER, training, layout)
    return predicted, table, fn(split_of(config)), config, training


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_2_and_3_reduce_every_micro_batch(zero):
    """Each micro-batch adds one reduction to the exposed data-parallel communication (ZeRO-2's parameter
    all-gather after the step stays one), and the step grows with it."""
    steps = {m: predict(zero, m)[0] for m in (1, 2, 4)}
    per_microbatch = steps[2].time.dp_comm_s - steps[1].time.dp_comm_s
    assert per_microbatch > 0.1
    assert steps[4].time.dp_comm_s - steps[1].time.dp_comm_s == pytest.approx(3 * per_microbatch, rel=1e-6)
    assert steps[4].step_time_s - steps[2].step_time_s >= 2 * per_microbatch


def test_zero_1_reduces_once_per_step():
    one, _, _, _, _ = predict(1, 1)
    four, _, _, _, _ = predict(1, 4)
    assert four.time.dp_comm_s == pytest.approx(one.time.dp_comm_s, rel=1e-6)


def test_a_pipelined_stage_that_accumulates_whole_gradients_reduces_once():
    """This runtime's stack under pipelining (``pipeline_reduces_once``): ZeRO-2's reduction after the stage's
    last backward, whatever the micro-batches."""
    two, table, _, _, _ = predict(2, 2, pp=2)
    eight, _, _, _, _ = predict(2, 8, pp=2)
    assert table.block.reduce_ns == 0 and table.sync_block_ns > 0
    assert eight.time.dp_comm_s == pytest.approx(two.time.dp_comm_s, rel=1e-6)


def test_a_blocks_reduction_is_its_fp32_gradients_over_the_data_parallel_link():
    """ZeRO-2: the block's parameters x 4 bytes (the stack reduces in fp32) reduce-scattered over the 16 ranks,
    hidden up to the block's backward; with the overlap off, all of it waits."""
    _, table, workload, config, training = predict(2, 4)
    block = workload.block
    link = group_link(CLUSTER, config.dims.span("dp_cp"))
    reduce = collective_time_s("reduce_scatter", block.params * 4, link)
    assert reduce > block.bwd_s  # the case the test is about
    assert table.block.reduce_ns == ns(reduce - block.bwd_s)
    assert table.sync_block_ns == 0  # not once more at the end of the step
    exposed = device_table(workload, CLUSTER, dataclasses.replace(training, overlap_grad_reduce=False), config)
    assert exposed.block.reduce_ns == ns(reduce)


def test_gradients_are_counted_in_the_dtype_the_stack_accumulates_them_in():
    """bf16 compute: this runtime (FSDP2, fp32 reduce dtype) holds ZeRO-1's whole gradients and every stage's
    gradient shards in fp32 (tests/runtime/test_zero_reductions.py sees it on 2 ranks); Megatron's gradient
    buffer is in the compute dtype (``grad_reduce_in_fp32`` off)."""
    from autoplan.cost.stage_table import rank_state_bytes
    from autoplan.schema import load_stack

    training = TrainingSetup(global_batch_size=16, seq_len=128, precision="bf16")
    counted = {}
    for zero in (0, 1, 2, 3):
        config = Config(tp=1, pp=1, dp=8, cp=1, sequence_parallel=False, zero_stage=zero, offload_optimizer=False,
                        schedule="1f1b", virtual_stages=1, micro_batch_size=1, num_microbatches=2)
        counted[zero] = {name: rank_state_bytes(training, config, load_stack(name)).gradients
                         for name in ("autoplan", "torchtitan", "megatron")}
    for zero in (0, 1):
        assert counted[zero] == {"autoplan": 4, "torchtitan": 4, "megatron": 2}
    for zero in (2, 3):
        assert counted[zero] == {"autoplan": 4 / 8, "torchtitan": 4 / 8, "megatron": 2 / 8}
