"""The pipeline schedules (autoplan.schema.schedule.build_schedule): the lists the cost model simulates
are the ones the runtime executes, and they are torch's own schedules.

1. Multi-process (gloo): the order torch actually *executed* in the test-matrix runs (recorded by hooks
   on each stage module, tests/runtime/rt_worker.py) equals our lists, for all three schedules. Holds by
   construction -- the runtime hands these lists to torch's ``_PipelineScheduleRuntime`` -- and this
   checks the construction (tests/runtime/test_planner_plans.py checks it for every planner plan too).
2. Single process, over a grid of (pp, micro-batches): our lists equal torch's schedule IR --
   ScheduleGPipe._get_pipeline_order(), Schedule1F1B._get_pipeline_order() (all ranks but the last, see
   below) and ScheduleInterleaved1F1B._calculate_single_rank_operations() for v = 2, 3 -- so the
   schedules we run are torch's (the objects are made with __new__ and only the attributes read).
Torch 2.13's Schedule1F1B IR is wrong for the last rank (it starts at micro-batch 1 and ends at m); its
own executed loop runs F0 B0 F1 B1 ... there, which is our list and what we now run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from autoplan.schema.schedule import build_schedule, check_schedule

sys.path.insert(0, str(Path(__file__).parent / "runtime"))

GRID = [(pp, m) for pp in (2, 3, 4, 8) for m in (1, 2, 3, 4, 6, 8, 12, 16)]


def compute_only(actions) -> list[str]:
    """torch actions -> "2F0" strings, dropping idle slots (None) and non-compute markers."""
    return [f"{a.stage_index}{a.computation_type.value}{a.microbatch_index}" for a in actions
            if a is not None and a.computation_type.value in ("F", "B")]


def ours(kind: str, pp: int, v: int, m: int) -> dict[int, list[str]]:
    return {r: [str(a) for a in acts] for r, acts in build_schedule(kind, pp, v, m).items()}


@pytest.mark.parametrize(("pp", "m"), GRID)
def test_gpipe_ir(pp, m):
    sch = ScheduleGPipe.__new__(ScheduleGPipe)
    sch._num_stages, sch._n_microbatches = pp, m
    torch_order = sch._get_pipeline_order()
    assert {r: compute_only(a) for r, a in torch_order.items()} == ours("gpipe", pp, 1, m)


@pytest.mark.parametrize(("pp", "m"), [(pp, m) for pp, m in GRID if m >= pp])
def test_1f1b_ir_all_but_last_rank(pp, m):
    sch = Schedule1F1B.__new__(Schedule1F1B)
    sch._num_stages, sch._n_microbatches = pp, m
    torch_order = sch._get_pipeline_order()
    expected = ours("1f1b", pp, 1, m)
    for rank in range(pp - 1):
        assert compute_only(torch_order[rank]) == expected[rank], rank


@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize(("pp", "m"), GRID)
def test_interleaved_ir(pp, m, v):
    rounds = max(1, m // pp)
    if m % rounds:
        pytest.skip("the plan refuses this micro-batch count for interleaved (schema Layout.validate)")
    sch = ScheduleInterleaved1F1B.__new__(ScheduleInterleaved1F1B)
    sch.pp_group_size, sch.n_local_stages, sch._n_microbatches = pp, v, m
    sch.number_of_rounds, sch.microbatches_per_round = rounds, m // rounds
    expected = ours("interleaved", pp, v, m)
    for rank in range(pp):
        sch.rank = rank
        assert compute_only(sch._calculate_single_rank_operations(rank)) == expected[rank], rank
    check_schedule(build_schedule("interleaved", pp, v, m), "interleaved", pp, pp * v, m)


EXECUTED = [(2, "pp2_gpipe"), (2, "pp2_1f1b"), (2, "pp2_interleaved_v2"), (2, "pp2_1f1b_unequal"),
            (4, "pp4_gpipe"), (4, "pp4_1f1b"), (4, "pp4_interleaved_v2"), (4, "pp4_gpipe_unequal"),
            (4, "llama_tp2_pp2")]


@pytest.mark.slow
@pytest.mark.parametrize(("world", "name"), EXECUTED, ids=[n for _, n in EXECUTED])
def test_executed_order_matches(world, name):
    from rt_cases import CASES
    from rt_launcher import matrix_results

    kw = CASES[world][name]
    got = matrix_results(world)[name]["orders"]
    pp = kw.get("pp", 1)
    expected = ours(kw.get("schedule", "1f1b"), pp, kw.get("virtual_stages", 1), kw["num_microbatches"])
    assert {int(r): acts for r, acts in got.items()} == expected
