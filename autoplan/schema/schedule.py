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

Zero-bubble schedules (Qi et al. 2024, "Zero Bubble Pipeline Parallelism") split a backward into ``I``,
the gradient with respect to the stage's input (what the previous stage waits for), and ``W``, the
gradients of the stage's weights (which nothing waits for), and run the ``W`` actions in what would be
bubbles: ``zb1p`` is torch's ScheduleInterleavedZeroBubble (ZB-H1 with one stage per rank, its interleaved
form with more), ``zbv`` torch's ScheduleZBVZeroBubble and ``dualpipev`` its ScheduleDualPipeV (DeepSeek
2024), both with two stages per rank placed in a V: rank r holds stages r and 2 pp - 1 - r, so the first
and the last stage share rank 0 and the middle two share the last rank (no transfer between them).
DualPipeV's overlapped forward-and-backward pairs run one after the other, as torch's runtime runs them
(``OVERLAP_F_B``'s sub-actions in order); its full backwards stay ``B``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from autoplan.errors import SpecError

Kind = Literal["F", "B", "I", "W"]
"""Forward, full backward, backward of the input only, backward of the weights only (after its ``I``)."""
ZERO_BUBBLE = ("zb1p", "zbv", "dualpipev")
"""Schedules with split backwards (``I`` then ``W``)."""
V_SHAPED = ("zbv", "dualpipev")
"""Schedules with two stages per rank in a V (rank r: stages r and 2 pp - 1 - r)."""


@dataclass(frozen=True, order=True)
class Action:
    stage: int
    kind: Kind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


RankOrders = dict[int, list[Action]]

_action = functools.lru_cache(maxsize=1 << 20)(Action)
"""The builders' constructor: one shared (frozen) object per action, which the schedules of one search
share (a dataclass's own constructor costs several times a cache hit, over 10^6 actions a search)."""


def stage_rank(schedule: str, stage: int, pp: int) -> int:
    """The pipeline rank that holds ``stage``: in a loop, stage s on rank s % pp (Narayanan et al. 2021;
    torch's looped schedules), or in a V for ``zbv`` and ``dualpipev`` (stage s < pp on rank s, stage
    s >= pp on rank 2 pp - 1 - s; torch's ``style="v"``). The one place placement is decided: the plan's
    checks, the cost model and the runtime's stage builder all ask here."""
    if schedule in V_SHAPED:
        return stage if stage < pp else 2 * pp - 1 - stage
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
    if schedule == "zb1p":
        return {r: zb1p_order(r, pp, virtual_stages, num_microbatches) for r in range(pp)}
    if schedule == "zbv":
        return {r: zbv_order(r, pp, num_microbatches) for r in range(pp)}
    if schedule == "dualpipev":
        if num_microbatches < 2 * pp:
            raise SpecError(f"num_microbatches: dualpipev needs at least 2 x pp = {2 * pp} micro-batches, got "
                            f"{num_microbatches}")
        return {r: dualpipev_order(r, pp, num_microbatches) for r in range(pp)}
    raise SpecError(f"schedule: {schedule!r} is not one of gpipe, 1f1b, interleaved, zb1p, zbv, dualpipev")


@functools.lru_cache(maxsize=256)
def forward_only_schedule(schedule: str, pp: int, virtual_stages: int, num_microbatches: int) -> RankOrders:
    """Per-rank compute order of a forward-only pass (evaluation) under ``schedule``: each rank's forwards,
    in the order the training list runs them, on the same stage placement.

    Why the training list's forwards and not a schedule of its own: a forward waits only for the forward
    of the previous stage on the same micro-batch, and the training list runs to completion, so an order
    of its forwards that respects those waits exists (the training run's own); keeping each rank's
    subsequence keeps that order valid, whatever the schedule -- no deadlock by construction. The runtime
    (runtime/evaluate.py) hands these lists to torch's lowering passes, and the cost model's ``simulate``
    accepts them as any other list (the time of a forward-only pass: m + pp - 1 forwards for one stage per
    rank). Cached like ``build_schedule``; treat the result as read-only."""
    orders = build_schedule(schedule, pp, virtual_stages, num_microbatches)
    return {rank: [a for a in actions if a.kind == "F"] for rank, actions in orders.items()}


def gpipe_order(rank: int, m: int) -> list[Action]:
    """All forwards, then all backwards, in micro-batch order."""
    return [_action(rank, "F", i) for i in range(m)] + [_action(rank, "B", i) for i in range(m)]


def one_f_one_b_order(rank: int, pp: int, m: int) -> list[Action]:
    """PipeDream-flush: pp-1-rank warm-up forwards, then alternate one forward and one backward."""
    warmup = min(pp - 1 - rank, m)
    actions = [_action(rank, "F", i) for i in range(warmup)]
    for i in range(m - warmup):
        actions += [_action(rank, "F", warmup + i), _action(rank, "B", i)]
    actions += [_action(rank, "B", i) for i in range(m - warmup, m)]
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
    # step k of the forwards (or backwards) runs local stage (k // per_round) % v (backwards: from the last)
    # on that stage's micro-batch (k // (v per_round)) per_round + k % per_round: the rounds before it
    forwards = _local_walk(rank, pp, v, per_round, total, "F")
    backwards = _local_walk(rank, pp, v, per_round, total, "B")
    # warm-up forwards, then one forward and one backward, then the cool-down backwards
    steady = [x for pair in zip(forwards[warmup:], backwards) for x in pair]
    return forwards[:warmup] + steady + backwards[total - warmup:]


def _local_walk(rank: int, pp: int, v: int, per_round: int, total: int, kind: Kind) -> list[Action]:
    """The ``total`` forwards (or backwards, local stages from the last) of a rank in interleaved order."""
    cycle = v * per_round  # a round on every local stage
    if kind == "F":
        return [_action((k // per_round) % v * pp + rank, kind, k // cycle * per_round + k % per_round)
                for k in range(total)]
    return [_action((v - 1 - (k // per_round) % v) * pp + rank, kind, k // cycle * per_round + k % per_round)
            for k in range(total)]


def zb1p_order(rank: int, pp: int, v: int, m: int) -> list[Action]:
    """Interleaved zero bubble (ZB1P) as torch 2.13 builds it (``ScheduleInterleavedZeroBubble``,
    ``_get_1f1b_rank_ops(enable_zero_bubble=True)``): interleaved 1F1B's order with each backward an ``I``,
    warm-up one forward per hop from the last rank, and each rank's ``W`` actions deferred by ``rank``
    backwards, then one after each ``I`` (the oldest first) and the rest at the end."""
    rounds = max(1, m // pp)
    per_round = m // rounds
    if m % rounds:
        raise SpecError(f"num_microbatches: zb1p needs a multiple of {rounds}, got {m}")
    total = v * m
    warmup = min((v - 1) * per_round + (pp - 1 - rank), total)

    # interleaved 1F1B's walks (``_local_walk``); a W repeats the stage and micro-batch of the I it defers
    # (torch counts W per stage in the same order as I)
    forwards = _local_walk(rank, pp, v, per_round, total, "F")
    inputs = _local_walk(rank, pp, v, per_round, total, "I")
    weights = [_action(a.stage, "W", a.microbatch) for a in inputs]
    actions = forwards[:warmup]
    for j in range(total):  # step warmup + j: a forward while any is left, the j-th I, the W deferred by `rank`
        if warmup + j < total:
            actions.append(forwards[warmup + j])
        actions.append(inputs[j])
        if j >= rank:  # torch's num_1f1b_microbatches
            actions.append(weights[j - rank])
    return actions + weights[max(0, total - rank):]


def zbv_order(rank: int, pp: int, m: int) -> list[Action]:
    """ZB-V (Qi et al. 2024, section 6) as torch 2.13 builds it (``ScheduleZBVZeroBubble``): stages ``rank``
    (chunk 0) and ``2 pp - 1 - rank`` (chunk 1); the list is built for max(2 pp - 1, m) micro-batches and
    the actions of micro-batches >= m are dropped, as torch drops them."""
    n = max(2 * pp - 1, m)
    c0, c1 = rank, 2 * pp - 1 - rank
    actions: list[Action] = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (pp - rank) - 1):
        actions.append(_action(c0, "F", f0))
        f0 += 1
    for _ in range(rank):
        actions += [_action(c1, "F", f1), _action(c0, "F", f0)]
        f1, f0 = f1 + 1, f0 + 1
    for _ in range(pp - rank):
        actions += [_action(c1, "F", f1), _action(c1, "I", b1), _action(c1, "W", b1)]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            actions.append(_action(c0, "F", f0))
            f0 += 1
        actions += [_action(c0, "I", b0), _action(c0, "W", b0), _action(c1, "F", f1), _action(c1, "I", b1),
                    _action(c1, "W", b1)]
        b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(rank):
        actions += [_action(c0, "I", b0), _action(c1, "I", b1)]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(pp - rank):
        actions += [_action(c0, "I", b0), _action(c0, "W", w0)]
        b0, w0 = b0 + 1, w0 + 1
    actions += [_action(c1, "W", i) for i in range(w1, b1)] + [_action(c0, "W", i) for i in range(w0, b0)]
    return [a for a in actions if a.microbatch < m]


def dualpipev_order(rank: int, pp: int, m: int) -> list[Action]:
    """DualPipeV (DeepSeek 2024, DualPipe's V form) as torch 2.13 builds it (``ScheduleDualPipeV``), each
    overlapped forward-and-backward pair as the two actions torch's runtime runs in turn. Needs m >= 2 pp."""
    c0, c1 = rank, 2 * pp - 1 - rank
    counters: dict[tuple[int, str], int] = {}
    pending_w: list[tuple[int, int]] = []
    actions: list[Action] = []

    def add(stage: int, kind: Kind) -> None:
        key = (stage, "I" if kind == "B" else kind)  # a full backward advances the input-backward count
        i = counters.get(key, 0)
        counters[key] = i + 1
        actions.append(_action(stage, kind, i))
        if kind == "I":
            pending_w.append((stage, i))

    def weight() -> None:
        if pending_w:
            stage, i = pending_w.pop(0)
            actions.append(_action(stage, "W", i))

    for _ in range(2 * (pp - rank - 1)):
        add(c0, "F")
    for _ in range(rank + 1):
        add(c0, "F")
        add(c1, "F")
    for _ in range(pp - rank - 1):
        add(c1, "I")
        weight()
        add(c1, "F")
    for i in range(m - 2 * pp + rank + 1):
        add(c0, "F")  # overlapped with (or, first on the last rank, followed by) chunk 1's backward
        add(c1, "B")
        add(c1, "F")
        add(c0, "B")
    for _ in range(pp - rank - 1):
        add(c1, "B")
        add(c1, "F")
        add(c0, "B")
    split = False
    for i in range(rank + 1):
        if i == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        add(c1, "I" if split else "B")
        if i == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        add(c0, "I" if split else "B")
    for _ in range(pp - rank - 1):
        weight()
        add(c0, "I" if split else "B")
    for _ in range(rank + 1):
        weight()
    return actions


def check_schedule(orders: RankOrders, schedule: str, pp: int, num_stages: int, m: int) -> None:
    """Schedule rules: each (stage, micro-batch) runs its forward and either one full backward or an input
    backward and then a weight backward, each exactly once, on the stage's rank, the forward first."""
    for rank, actions in orders.items():
        seen = set()
        for a in actions:
            owner = stage_rank(schedule, a.stage, pp)
            if owner != rank:
                raise AssertionError(f"rank {rank} runs {a}, which belongs to rank {owner}")
            if a in seen:
                raise AssertionError(f"rank {rank} runs {a} twice")
            if a.kind in "BI" and Action(a.stage, "F", a.microbatch) not in seen:
                raise AssertionError(f"rank {rank} runs {a} before its forward")
            if a.kind == "W" and Action(a.stage, "I", a.microbatch) not in seen:
                raise AssertionError(f"rank {rank} runs {a} before its input backward")
            seen.add(a)
        for s in stages_of_rank(schedule, rank, pp, num_stages // pp):
            for i in range(m):
                full, split = Action(s, "B", i) in seen, Action(s, "I", i) in seen and Action(s, "W", i) in seen
                if Action(s, "F", i) not in seen or full == split:
                    raise AssertionError(f"rank {rank}: stage {s} micro-batch {i} needs F and one of B or I + W")
        if len(seen) != sum(2 + (Action(a.stage, "I", a.microbatch) in seen) for a in seen if a.kind == "F"):
            raise AssertionError(f"rank {rank} runs actions of micro-batches outside 0..{m - 1}")


def check_forward_only(orders: RankOrders, schedule: str, pp: int, num_stages: int, m: int) -> None:
    """Forward-only rules: every rank runs only forwards, of its own stages, and each (stage, micro-batch)
    exactly once."""
    for rank, actions in orders.items():
        want = {Action(s, "F", i) for s in stages_of_rank(schedule, rank, pp, num_stages // pp) for i in range(m)}
        if any(a.kind != "F" for a in actions) or len(actions) != len(set(actions)) or set(actions) != want:
            raise AssertionError(f"rank {rank}: expected each forward of its stages once, got "
                                 f"{' '.join(map(str, actions))}")
