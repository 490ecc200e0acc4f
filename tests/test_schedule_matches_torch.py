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
   The zero-bubble schedules likewise: ScheduleInterleavedZeroBubble (zb1p, v = 1, 2, 3),
   ScheduleZBVZeroBubble (zbv) and ScheduleDualPipeV (dualpipev, its overlapped pairs as the two actions
   torch's runtime runs in turn).
3. The bubble each schedule leaves, simulated with forward = input backward = weight backward: the
   published formulas where they are exact.
Torch 2.13's Schedule1F1B IR is wrong for the last rank (it starts at micro-batch 1 and ends at m); its
own executed loop runs F0 B0 F1 B1 ... there, which is our list and what we now run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.pipelining.schedules import (
    ScheduleDualPipeV, ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble, _ComputationType,
)

from autoplan.cost.simulate import simulate
from autoplan.schema.schedule import build_schedule, check_schedule

sys.path.insert(0, str(Path(__file__).parent / "runtime"))

GRID = [(pp, m) for pp in (2, 3, 4, 8) for m in (1, 2, 3, 4, 6, 8, 12, 16)]


def compute_only(actions) -> list[str]:
    """torch actions -> "2F0" strings, dropping idle slots (None) and non-compute markers, an overlapped F+B
    pair (DualPipeV) as its two sub-actions, in the order torch's runtime runs them."""
    out = []
    for a in actions:
        if a is None:
            continue
        subs = a.sub_actions if a.computation_type == _ComputationType.OVERLAP_F_B else (a,)
        out += [f"{b.stage_index}{b.computation_type.value}{b.microbatch_index}" for b in subs
                if b.computation_type.value in ("F", "B", "I", "W")]
    return out


def rounds_schedule(cls, pp: int, v: int, m: int):
    """A torch looped schedule object (interleaved 1F1B or zero bubble) with just the attributes its
    per-rank order reads, made with __new__; None for a micro-batch count the plan refuses for it."""
    rounds = max(1, m // pp)
    if m % rounds:
        return None
    sch = cls.__new__(cls)
    sch.pp_group_size, sch.n_local_stages, sch._n_microbatches = pp, v, m
    sch.number_of_rounds, sch.microbatches_per_round = rounds, m // rounds
    return sch


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
    sch = rounds_schedule(ScheduleInterleaved1F1B, pp, v, m)
    if sch is None:
        pytest.skip("the plan refuses this micro-batch count for interleaved (schema Layout.validate)")
    expected = ours("interleaved", pp, v, m)
    for rank in range(pp):
        sch.rank = rank
        assert compute_only(sch._calculate_single_rank_operations(rank)) == expected[rank], rank
    check_schedule(build_schedule("interleaved", pp, v, m), "interleaved", pp, pp * v, m)


@pytest.mark.parametrize("v", [1, 2, 3])
@pytest.mark.parametrize(("pp", "m"), GRID)
def test_zb1p_ir(pp, m, v):
    sch = rounds_schedule(ScheduleInterleavedZeroBubble, pp, v, m)
    if sch is None:
        pytest.skip("the plan refuses this micro-batch count for zb1p (schema Layout.validate)")
    assert {r: compute_only(sch._calculate_single_rank_operations(r)) for r in range(pp)} == ours("zb1p", pp, v, m)
    check_schedule(build_schedule("zb1p", pp, v, m), "zb1p", pp, pp * v, m)


@pytest.mark.parametrize(("pp", "m"), GRID)
def test_zbv_and_dualpipev_ir(pp, m):
    for kind, cls in (("zbv", ScheduleZBVZeroBubble), ("dualpipev", ScheduleDualPipeV)):
        if kind == "dualpipev" and m < 2 * pp:
            continue  # torch refuses it too
        sch = cls.__new__(cls)
        sch.pp_group_size, sch._n_microbatches, sch.num_stages = pp, m, 2 * pp
        assert {r: compute_only(sch._calculate_single_rank_operations(r)) for r in range(pp)} == ours(kind, pp, 2, m)
        check_schedule(build_schedule(kind, pp, 2, m), kind, pp, 2 * pp, m)


def bubble(kind: str, pp: int, v: int, m: int) -> float:
    """Idle time of the step, in units of one stage's forward, with forward = input backward = weight
    backward = 1 (a full backward 2): the step's length less one rank's work."""
    stages = pp * v
    orders = build_schedule(kind, pp, v, m)
    end = max(simulate(orders, [1.0] * stages, [2.0] * stages, [0.0] * (stages - 1), 0.0, [1.0] * stages)
              .rank_end.values())
    return end - 3 * m * v


@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_bubbles_against_the_published_formulas(pp, k):
    """m = k x pp micro-batches. 1F1B: (p - 1)(F + B) (Narayanan et al. 2021; DualPipe's table); ZB-H1, which
    zb1p is with one stage per rank: (p - 1)(F + B - 2W) with B the full backward, a third of 1F1B's (Qi et al.
    2024, DualPipe's table "ZB1P"). zbv and dualpipev (two stages of half the layers per rank): what no
    schedule can avoid, the last rank waiting for micro-batch 0's forwards through the p - 1 chunks in front
    of it, (p - 1) F; Qi et al. call ZB-V's bubble zero at F = B = W, counting that warm-up out. DualPipe's
    own formula, (PP/2 - 1)(F&B + B - 3W), is for the bidirectional schedule on PP ranks; its V form's
    lists reach the (p - 1) F floor once m >= 2 p; with m = p, zbv (dualpipev needs 2 p) idles twice that."""
    m = k * pp
    F, B, W = 1.0, 2.0, 1.0  # B: a full backward, input half + weight half
    assert bubble("1f1b", pp, 1, m) == (pp - 1) * (F + B)
    assert bubble("zb1p", pp, 1, m) == (pp - 1) * (F + B - 2 * W) == bubble("1f1b", pp, 1, m) / 3
    if k >= 2:
        assert bubble("zbv", pp, 2, m) == bubble("dualpipev", pp, 2, m) == (pp - 1) * F
    else:
        assert bubble("zbv", pp, 2, m) == 2 * (pp - 1) * F


EXECUTED = [(2, "pp2_gpipe"), (2, "pp2_1f1b"), (2, "pp2_interleaved_v2"), (2, "pp2_1f1b_unequal"),
            (4, "pp4_gpipe"), (4, "pp4_1f1b"), (4, "pp4_interleaved_v2"), (4, "pp4_gpipe_unequal"),
            (4, "llama_tp2_pp2"), (2, "pp2_zb1p"), (2, "pp2_zbv"), (2, "pp2_dualpipev"), (4, "pp4_zb1p"),
            (4, "llama_tp2_pp2_zb1p_v2"), (4, "gpt_pp2_dp2_zero1_dualpipev_recompute")]


@pytest.mark.slow
@pytest.mark.parametrize(("world", "name"), EXECUTED, ids=[n for _, n in EXECUTED])
def test_executed_order_matches(world, name):
    from rt_cases import CASES
    from rt_helpers import as_recorded
    from rt_launcher import matrix_results

    kw = CASES[world][name]
    got = matrix_results(world)[name]["orders"]
    pp = kw.get("pp", 1)
    expected = ours(kw.get("schedule", "1f1b"), pp, kw.get("virtual_stages", 1), kw["num_microbatches"])
    assert {int(r): acts for r, acts in got.items()} == {r: as_recorded(acts) for r, acts in expected.items()}
