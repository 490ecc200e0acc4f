"""The gradient reductions the cost model prices are the ones the runtime issues: without pipelining, ZeRO 0
and 1 reduce once per step, ZeRO 2 and 3 once per micro-batch (cost/stage_table.py ``reduces_each_microbatch``),
counted from torch's profiler on 2 gloo ranks (tests/runtime/zero_worker.py: one launch, every stage); and the
gradients it holds are in the dtype the model counts (``rank_state_bytes``)."""

import pytest

from autoplan.cost.stage_table import Config, reduces_each_microbatch
from autoplan.schema import load_stack
from rt_launcher import worker_results

MICROBATCHES = 3  # zero_worker.MICROBATCHES


@pytest.mark.slow
def test_the_runtime_reduces_as_often_as_the_cost_model_prices(tmp_path):
    out = tmp_path / "zero.json"
    counts = worker_results(2, "zero_worker.py", [str(out)], out)
    stack = load_stack("autoplan")
    for zero in (0, 1, 2, 3):
        config = Config(tp=1, pp=1, dp=2, cp=1, sequence_parallel=False, zero_stage=zero, offload_optimizer=False,
                        schedule="gpipe", virtual_stages=1, micro_batch_size=1, num_microbatches=MICROBATCHES)
        per_step = MICROBATCHES if reduces_each_microbatch(config, stack) else 1
        c = counts[str(zero)]
        if zero == 0:  # replicate: one bucketed all-reduce of the whole model
            assert (c["all_reduce"], c["reduce_scatter"]) == (per_step, 0)
        else:  # one reduce-scatter per FSDP unit (each block, then the root)
            assert (c["reduce_scatter"], c["all_reduce"]) == (per_step * c["units"], 0), zero
    assert counts["2"]["reduce_scatter"] == MICROBATCHES * counts["1"]["reduce_scatter"]  # not vacuous
    # and what ZeRO-1 holds between micro-batches under bf16 compute: whole gradients in fp32, the reduce dtype,
    # which is what rank_state_bytes counts for this stack (tests/planner/test_zero_reduction.py)
    bf16 = counts["bf16"]
    assert bf16["dtypes"] == ["torch.float32"] and bf16["elements"] == bf16["parameters"]
    assert bf16["shard_grad_dtypes"] == ["torch.float32"]
