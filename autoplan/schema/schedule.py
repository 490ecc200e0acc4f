"""Pipeline schedules as data: for each pipeline rank, the ordered list of compute actions it runs.

One schedule, two users, one source: the cost model simulates these lists (``cost/simulate.py``) and the
runtime hands these very lists to torch.distributed.pipelining's schedule interpreter
(``_PipelineScheduleRuntime``, runtime/parallel/pipeline.py), which adds the sends and receives and runs
them; so the simulated order is the executed order by construction, for every schedule. The lists are
part of the contract (they follow from the plan's schedule, pp, virtual_stages and num_microbatches),
hence here in ``autoplan.schema``, torch-free.

GPipe and interleaved 1F1B are torch 2.13's orders (``ScheduleGPipe._get_pipeline_order``,
``ScheduleInterleaved1F1B._calculate_single_rank_operations``; tests/test_schedule_matches_torch.py).
1F1B is PipeDream-flush as torch's Schedule1F1B *executes* it (its IR for the last rank is off by one
micro-batch in 2.13, which no longer matters: we run our list, not torch's).

An action prints as torch prints it: ``2F0`` is the forward of micro-batch 0 on stage 2, ``1B3`` the
backward of micro-batch 3 on stage 1.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from autoplan.errors import SpecError

Kind = Literal["F", "B"]


@dataclass(frozen=True, order=True)
class Action:
    stage: int
    kind: Kind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


RankOrders = dict[int, list[Action]]


def stage_rank(schedule: str, stage: int, pp: int) -> int:
    """The pipeline rank that holds ``stage``. Every schedule here places stages in a loop: stage s on rank
    s % pp (Narayanan et al. 2021; torch's looped schedules). The one place placement is decided: the
    plan's checks, the cost model and the runtime's stage builder all ask here."""
    return stage % pp


def stages_of_rank(schedule: str, rank: int, pp: int, virtual_stages: int) -> tuple[int, ...]:
    """The stages ``rank`` holds, in stage order."""
    return tuple(s for s in range(pp * virtual_stages) if stage_rank(schedule, s, pp) == rank)


@functools.lru_cache(maxsize=4096)
def build_schedule(schedule: str, pp: int, virtual_stages: int, num_microbatches: int) -> RankOrders:
    """Per-rank compute order for ``schedule`` on ``pp`` ranks; stage ``s`` lives on ``stage_rank``.

    Cached: the search asks for the same few schedules thousands of times. Treat the result as read-only.
    """
    if schedule == "gpipe":
        return {r: gpipe_order(r, num_microbatches) for r in range(pp)}
    if schedule == "1f1b":
        if num_microbatches < pp:
            raise SpecError(f"num_microbatches: 1f1b needs at least pp={pp} micro-batches, got {num_microbatches}")
        return {r: one_f_one_b_order(r, pp, num_microbatches) for r in range(pp)}
    if schedule == "interleaved":
        return {r: interleaved_order(r, pp, virtual_stages, num_microbatches) for r in range(pp)}
    raise SpecError(f"schedule: {schedule!r} is not one of gpipe, 1f1b, interleaved")


def gpipe_order(rank: int, m: int) -> list[Action]:
    """All forwards, then all backwards, in micro-batch order."""
    return [Action(rank, "F", i) for i in range(m)] + [Action(rank, "B", i) for i in range(m)]


def one_f_one_b_order(rank: int, pp: int, m: int) -> list[Action]:
    """PipeDream-flush: pp-1-rank warm-up forwards, then alternate one forward and one backward."""
    warmup = min(pp - 1 - rank, m)
    actions = [Action(rank, "F", i) for i in range(warmup)]
    for i in range(m - warmup):
        actions += [Action(rank, "F", warmup + i), Action(rank, "B", i)]
    actions += [Action(rank, "B", i) for i in range(m - warmup, m)]
    return actions


def interleaved_order(rank: int, pp: int, v: int, m: int) -> list[Action]:
    """Interleaved 1F1B (Narayanan et al. 2021) as torch builds it: depth-first over local stages in rounds.

    Micro-batches go through the rank's local stages in groups of ``m // rounds`` (a "round"); warm-up
    runs (v - 1) rounds plus 2 per hop from the last rank, then one forward and one backward alternate.
    """
    rounds = max(1, m // pp)
    per_round = m // rounds
    if m % rounds:
        raise SpecError(f"num_microbatches: interleaved needs a multiple of {rounds}, got {m}")
    total = v * m
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), total)

    def forward_stage(step: int) -> int:
        return ((step // per_round) % v) * pp + rank

    def backward_stage(step: int) -> int:
        return (v - 1 - ((step - warmup) // per_round) % v) * pp + rank

    next_fwd: dict[int, int] = {}
    next_bwd: dict[int, int] = {}

    def take(counter: dict[int, int], stage: int) -> int:
        counter[stage] = counter.get(stage, 0) + 1
        return counter[stage] - 1

    actions: list[Action] = []
    for step in range(total + warmup):
        if step < total:  # a forward at this step (warm-up or steady state)
            s = forward_stage(step)
            actions.append(Action(s, "F", take(next_fwd, s)))
        if step >= warmup:  # a backward at this step (steady state or cool-down)
            s = backward_stage(step)
            actions.append(Action(s, "B", take(next_bwd, s)))
    return actions


def check_schedule(orders: RankOrders, schedule: str, pp: int, num_stages: int, m: int) -> None:
    """Schedule rules: each (stage, micro-batch) forward and backward exactly once, on the stage's rank,
    forward before backward on that rank, and micro-batches in order per stage and kind."""
    for rank, actions in orders.items():
        seen = set()
        for a in actions:
            owner = stage_rank(schedule, a.stage, pp)
            if owner != rank:
                raise AssertionError(f"rank {rank} runs {a}, which belongs to rank {owner}")
            if a in seen:
                raise AssertionError(f"rank {rank} runs {a} twice")
            if a.kind == "B" and Action(a.stage, "F", a.microbatch) not in seen:
                raise AssertionError(f"rank {rank} runs {a} before its forward")
            seen.add(a)
        expected = {Action(s, k, i) for s in stages_of_rank(schedule, rank, pp, num_stages // pp) for k in "FB"
                    for i in range(m)}
        if seen != expected:
            missing = sorted(expected - seen)[:3]
            raise AssertionError(f"rank {rank} misses {', '.join(map(str, missing))}")
