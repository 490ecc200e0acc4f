"""Pipeline action lists on a host whose ranks share cores: a processor-sharing simulation.

``simulate.py`` gives every action its own duration, as on GPUs, where a rank computes at the same speed
whatever the others do. On a CPU host the ranks of a node time-slice its cores: while n ranks compute,
each runs at 1 / slowdown(n) of its solo speed (``Cluster.corun_slowdown``, measured by
profiler/hardware/corun.py), and a rank blocked in a receive frees its share. Within a pipeline n changes
all the time: in the warm-up one rank computes, in the steady state all of them, in the drain one again.
A single factor at the mean number of busy ranks misses that the busy phases are slowed more than the idle
phases are sped up (the slow-down grows faster than linearly past the core count), and that a stage
slowed by its neighbours delays the stages after it. Uniform GPipe on 4 stages, 4 micro-batches and 2
cores: 27 time units here against 24 for the mean-field factor (tests/planner/test_shared_cores.py works
it by hand).

``shared_span`` runs the same dependency graph as ``simulate`` (``compiled``) as a fluid model: each rank
works through its list; an action starts once its rank is free and its inputs have arrived; between two
events (an action ends, an input arrives) every computing rank progresses at the rate its node's busy
count gives. Exact for processor sharing with these rates; the rates are the measured co-running
slow-downs, nothing fitted to runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from autoplan.cost.simulate import compiled, slot_durations
from autoplan.schema.schedule import RankOrders


def shared_span(orders: RankOrders, fwd: Sequence[float], bwd: Sequence[float], p2p: Sequence[float],
                slowdown: Callable[[float], float], node_of: Sequence[int] | None = None,
                replicas: int = 1) -> float:
    """When the last rank finishes, each action taking ``fwd[s]``/``bwd[s]`` of solo time.

    ``slowdown(n)``: the factor on a rank's time while n processes compute on its node. ``node_of[r]``:
    the node of pipeline rank r (default: all on one); ``replicas``: processes per pipeline rank on its
    node (its tp x cp x dp peers, which run the same list in lock-step), so a node with k busy pipeline
    ranks has ``replicas * k`` processes computing.
    """
    num_stages = len(fwd)
    g = compiled(orders, num_stages)
    pp = len(orders)
    nodes = list(node_of) if node_of is not None else [0] * pp
    durations = slot_durations(fwd, bwd, None)  # a split backward's input half takes it all (W = 0)
    transfer = list(p2p) + [0.0]
    lists: dict[int, list[int]] = {r: [] for r in orders}
    for i, rank in enumerate(g.ranks):
        lists[rank].append(i)
    end = [math.nan] * len(g.rows)
    cursor = {r: 0 for r in lists}
    remaining = {r: durations[g.rows[lists[r][0]][5]] for r in lists if lists[r]}
    active = [r for r in lists if lists[r]]
    t = 0.0

    def ready_at(i: int) -> float:
        """When action i may start (inf while an input is still being computed)."""
        prev, d1, e1, d2, e2, _ = g.rows[i]
        ready = 0.0
        for d, edge in ((prev, -1), (d1, e1), (d2, e2)):
            if d >= 0:
                if math.isnan(end[d]):
                    return math.inf
                ready = max(ready, end[d] + transfer[edge])
        return ready

    while active:
        ready = {r: ready_at(lists[r][cursor[r]]) for r in active}
        running = [r for r in active if ready[r] <= t]
        busy: dict[int, int] = {}
        for r in running:
            busy[nodes[r]] = busy.get(nodes[r], 0) + replicas
        rate = {r: 1.0 / slowdown(busy[nodes[r]]) for r in running}
        finish = {r: t + remaining[r] / rate[r] for r in running}
        arrivals = [ready[r] for r in active if t < ready[r] < math.inf]
        upcoming = min(list(finish.values()) + arrivals, default=math.inf)
        if upcoming == math.inf:
            raise RuntimeError("pipeline schedule: no rank can make progress")  # compiled() rules this out
        for r in running:
            if finish[r] <= upcoming:
                i = lists[r][cursor[r]]
                end[i] = upcoming
                cursor[r] += 1
                if cursor[r] < len(lists[r]):
                    remaining[r] = durations[g.rows[lists[r][cursor[r]]][5]]
            else:
                remaining[r] -= (upcoming - t) * rate[r]
        t = upcoming
        active = [r for r in active if cursor[r] < len(lists[r])]
    return t
