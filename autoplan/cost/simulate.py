"""Simulate per-rank pipeline action lists with per-stage durations: step time, idle time, critical path.

Each rank runs its actions in list order, one at a time. A forward of stage s waits for the forward of
stage s-1 on the same micro-batch plus the point-to-point transfer between them; a backward of stage s
waits for the backward of stage s+1 (or, on the last stage, its own forward) plus the transfer. Sends are
asynchronous (they cost the receiver latency, not the sender's compute), as in torch's schedules and
Megatron's. A list that cannot make progress is a deadlock, reported as such.

Because every start time is the maximum of its predecessors' end times, the step time is the length of
the longest (critical) path through this graph. ``critical_path`` returns that path as counts of
forward/backward actions per stage and the transfers on it; the CP-SAT search uses those counts as
linear cuts (search/cpsat.py), so it optimises exactly the quantity simulated here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from autoplan.schema.schedule import Action, RankOrders


@dataclass(frozen=True)
class Timeline:
    actions: list[Action]
    """Every action once, in an order that respects all dependencies; the arrays below follow it."""
    start: list[float]
    end: list[float]
    binding: list[tuple[int, bool] | None]
    """For each action, the index of the predecessor whose end determined its start and whether a
    transfer between stages lay in between (None: it started at time 0)."""
    rank_end: dict[int, float]
    """When each rank finishes its last action."""
    last_index: dict[int, int]

    def busy(self, rank: int) -> float:
        return sum(self.end[i] - self.start[i] for i, a in enumerate(self.actions) if a.stage % len(self.rank_end) == rank)


@dataclass(frozen=True)
class CriticalPath:
    forwards: Counter
    """Forward actions per stage on the path."""
    backwards: Counter
    transfers: Counter
    """Point-to-point transfers per edge (s, s+1) on the path, either direction."""
    end_rank: int


@dataclass(frozen=True)
class _Graph:
    actions: list[Action]
    stage: list[int]
    forward: list[bool]
    prev: list[int]
    """Index of the previous action on the same rank, -1 for a rank's first."""
    deps: list[list[tuple[int, int]]]
    """Data dependencies as (index, transfer edge or -1)."""
    last_index: dict[int, int]


def simulate(orders: RankOrders, fwd_s: list[float], bwd_s: list[float], p2p_s: list[float]) -> Timeline:
    """``fwd_s[s]``/``bwd_s[s]``: durations of stage s; ``p2p_s[s]``: transfer time between s and s+1."""
    g = _graph(orders, len(fwd_s))
    n = len(g.actions)
    start, end = [0.0] * n, [0.0] * n
    binding: list[tuple[int, bool] | None] = [None] * n
    for i in range(n):
        p = g.prev[i]
        ready, why = (end[p], (p, False)) if p >= 0 else (0.0, None)
        for d, edge in g.deps[i]:
            t = end[d] + (p2p_s[edge] if edge >= 0 else 0.0)
            if t > ready:
                ready, why = t, (d, edge >= 0)
        start[i] = ready
        end[i] = ready + (fwd_s[g.stage[i]] if g.forward[i] else bwd_s[g.stage[i]])
        binding[i] = why
    rank_end = {r: end[i] for r, i in g.last_index.items()}
    return Timeline(g.actions, start, end, binding, rank_end, g.last_index)


_GRAPHS: dict[int, tuple[RankOrders, _Graph]] = {}


def _graph(orders: RankOrders, num_stages: int) -> _Graph:
    """Actions in an order that respects every dependency, with their rank predecessor and data
    dependencies as indices. Built once per schedule object (build_schedule caches those) and reused:
    it depends on the action order only, not on durations. A deadlock is found here."""
    cached = _GRAPHS.get(id(orders))
    if cached is not None and cached[0] is orders:
        return cached[1]
    index: dict[Action, int] = {}
    actions: list[Action] = []
    prev: list[int] = []
    cursor = {r: 0 for r in orders}
    remaining = sum(len(a) for a in orders.values())
    while remaining:
        progressed = False
        for rank, acts in orders.items():
            while cursor[rank] < len(acts):
                action = acts[cursor[rank]]
                if any(d not in index for d in _dependencies(action, num_stages)):
                    break
                index[action] = len(actions)
                actions.append(action)
                prev.append(index[acts[cursor[rank] - 1]] if cursor[rank] else -1)
                cursor[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: str(a[cursor[r]]) for r, a in orders.items() if cursor[r] < len(a)}
            raise RuntimeError(f"pipeline schedule deadlocks; next actions per rank: {stuck}")
    deps = [[(index[d], min(d.stage, a.stage) if d.stage != a.stage else -1) for d in _dependencies(a, num_stages)]
            for a in actions]
    graph = _Graph(actions, [a.stage for a in actions], [a.kind == "F" for a in actions], prev, deps,
                   {r: index[a[-1]] for r, a in orders.items() if a})
    if len(_GRAPHS) > 4096:
        _GRAPHS.clear()
    _GRAPHS[id(orders)] = (orders, graph)
    return graph


def data_dependencies(action: Action, num_stages: int) -> list[Action]:
    """The actions whose outputs ``action`` consumes; a dependency on another stage crosses the transfer
    edge ``min(stage, other stage)``. Public for the trace views (report/chrome_trace.py), which draw the
    transfers the simulation charged."""
    return _dependencies(action, num_stages)


def _dependencies(action: Action, num_stages: int) -> list[Action]:
    s, mb = action.stage, action.microbatch
    if action.kind == "F":
        return [Action(s - 1, "F", mb)] if s > 0 else []
    if s == num_stages - 1:
        return [Action(s, "F", mb)]
    return [Action(s + 1, "B", mb), Action(s, "F", mb)]


def critical_path(timeline: Timeline, rank: int) -> CriticalPath:
    """The chain of binding predecessors that ends with ``rank``'s last action."""
    forwards: Counter = Counter()
    backwards: Counter = Counter()
    transfers: Counter = Counter()
    i: int | None = timeline.last_index[rank]
    while i is not None:
        action = timeline.actions[i]
        (forwards if action.kind == "F" else backwards)[action.stage] += 1
        binding = timeline.binding[i]
        if binding is None:
            break
        j, crosses = binding
        if crosses:
            transfers[min(action.stage, timeline.actions[j].stage)] += 1
        i = j
    return CriticalPath(forwards, backwards, transfers, rank)


_PEAKS: dict[int, tuple[RankOrders, dict]] = {}


def inflight_peaks(orders: RankOrders) -> dict[int, list[dict[int, int]]]:
    """Per rank, the micro-batches each of its stages holds at every local peak of activation memory.

    A forward adds one micro-batch's activations to its stage, a backward frees them; peaks occur right
    after a forward that is followed by a backward (or ends the list). The order on a rank is fixed, so
    these counts do not depend on durations: memory = max over the returned vectors of
    sum(count[s] * bytes_per_microbatch[s]), which is linear in the stage layouts for each vector.
    """
    cached = _PEAKS.get(id(orders))
    if cached is not None and cached[0] is orders:
        return cached[1]
    peaks: dict[int, list[dict[int, int]]] = {}
    for rank, actions in orders.items():
        live: Counter = Counter()
        found: list[dict[int, int]] = []
        for i, a in enumerate(actions):
            live[a.stage] += 1 if a.kind == "F" else -1
            nxt = actions[i + 1] if i + 1 < len(actions) else None
            if a.kind == "F" and (nxt is None or nxt.kind == "B"):
                vector = {s: c for s, c in live.items() if c}
                if vector not in found:
                    found.append(vector)
        peaks[rank] = [v for v in found if not any(_dominates(w, v) for w in found if w is not v)]
    if len(_PEAKS) > 4096:
        _PEAKS.clear()
    _PEAKS[id(orders)] = (orders, peaks)
    return peaks


def _dominates(a: dict[int, int], b: dict[int, int]) -> bool:
    return a != b and all(a.get(s, 0) >= c for s, c in b.items())
