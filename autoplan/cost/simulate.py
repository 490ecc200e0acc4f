"""Simulate per-rank pipeline action lists with per-stage durations: step time, idle time, critical path.

Each rank runs its actions in list order, one at a time. A forward of stage s waits for the forward of
stage s-1 on the same micro-batch plus the point-to-point transfer between them; a backward of stage s
waits for the backward of stage s+1 (or, on the last stage, its own forward) plus the transfer. Sends are
asynchronous (they cost the receiver latency, not the sender's compute), as in torch's schedules and
Megatron's. A list that cannot make progress is a deadlock, reported as such.

Because every start time is the maximum of its predecessors' end times, the step time is the length of
the longest (critical) path through this graph. ``critical_path`` returns that path as counts of
forward/backward actions per stage and the transfers on it (the breakdown of pipeline transfers reads it).

Two entry points over the same graph: ``simulate`` keeps every start, end and binding predecessor (for
reports and the timeline drawing); ``rank_ends`` computes only when each rank finishes, from the graph
compiled once per schedule into flat integer rows, which is what the search calls thousands of times.
Both work for any valid per-rank action list; nothing assumes the shape of a particular schedule.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from autoplan.cost.schedule import Action, RankOrders


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
    # actions as (stage, is_forward, micro-batch) tuples: hashing those is far cheaper than dataclasses
    lists = {r: [(a.stage, a.kind == "F", a.microbatch) for a in acts] for r, acts in orders.items()}
    index: dict[tuple[int, bool, int], int] = {}
    actions: list[Action] = []
    keys: list[tuple[int, bool, int]] = []
    prev: list[int] = []
    cursor = {r: 0 for r in orders}
    remaining = sum(len(a) for a in orders.values())
    while remaining:
        progressed = False
        for rank, acts in lists.items():
            c, n = cursor[rank], len(acts)
            while c < n:
                key = acts[c]
                if any(d not in index for d in _dependency_keys(key, num_stages)):
                    break
                index[key] = len(actions)
                actions.append(orders[rank][c])
                keys.append(key)
                prev.append(index[acts[c - 1]] if c else -1)
                c += 1
                remaining -= 1
                progressed = True
            cursor[rank] = c
        if not progressed:
            stuck = {r: str(a[cursor[r]]) for r, a in orders.items() if cursor[r] < len(a)}
            raise RuntimeError(f"pipeline schedule deadlocks; next actions per rank: {stuck}")
    deps = [[(index[d], min(d[0], k[0]) if d[0] != k[0] else -1) for d in _dependency_keys(k, num_stages)]
            for k in keys]
    graph = _Graph(actions, [k[0] for k in keys], [k[1] for k in keys], prev, deps,
                   {r: index[a[-1]] for r, a in lists.items() if a})
    if len(_GRAPHS) > 4096:
        _GRAPHS.clear()
    _GRAPHS[id(orders)] = (orders, graph)
    return graph


@dataclass(frozen=True)
class Compiled:
    """The graph as rows (rank predecessor, dependency 1, its transfer edge, dependency 2, its edge,
    duration slot), with -1 for "none": index -1 of the end-time list and of the transfer list holds 0."""

    rows: tuple[tuple[int, int, int, int, int, int], ...]
    last_index: dict[int, int]


_COMPILED: dict[int, tuple[RankOrders, Compiled]] = {}


def compiled(orders: RankOrders, num_stages: int) -> Compiled:
    """Rows for ``rank_ends``; cached per schedule object like the graph itself."""
    cached = _COMPILED.get(id(orders))
    if cached is not None and cached[0] is orders:
        return cached[1]
    g = _graph(orders, num_stages)
    rows = []
    for i in range(len(g.actions)):
        deps = list(g.deps[i]) + [(-1, -1)] * (2 - len(g.deps[i]))
        (d1, e1), (d2, e2) = deps
        rows.append((g.prev[i], d1, e1, d2, e2, g.stage[i] + (0 if g.forward[i] else num_stages)))
    result = Compiled(tuple(rows), dict(g.last_index))
    if len(_COMPILED) > 4096:
        _COMPILED.clear()
    _COMPILED[id(orders)] = (orders, result)
    return result


def rank_ends(c: Compiled, fwd: list[int], bwd: list[int], p2p: list[int]) -> dict[int, int]:
    """When each rank's last action ends: the same recurrence as ``simulate``, on integers (ns)."""
    durations = fwd + bwd
    transfer = list(p2p) + [0]
    end = [0] * (len(c.rows) + 1)
    for i, (prev, d1, e1, d2, e2, slot) in enumerate(c.rows):
        t = end[prev]
        u = end[d1] + transfer[e1]
        if u > t:
            t = u
        u = end[d2] + transfer[e2]
        if u > t:
            t = u
        end[i] = t + durations[slot]
    return {r: end[i] for r, i in c.last_index.items()}


def _dependency_keys(key: tuple[int, bool, int], num_stages: int) -> tuple[tuple[int, bool, int], ...]:
    """What an action (stage, is_forward, micro-batch) waits for besides its rank's previous action: a
    forward, the forward of the stage before; a backward, the backward of the stage after (on the last
    stage none) and its own forward."""
    s, forward, mb = key
    if forward:
        return ((s - 1, True, mb),) if s > 0 else ()
    if s == num_stages - 1:
        return ((s, True, mb),)
    return ((s + 1, False, mb), (s, True, mb))


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
        stages = sorted({a.stage for a in actions})
        slot = {st: i for i, st in enumerate(stages)}
        live = [0] * len(stages)
        found: set[tuple[int, ...]] = set()
        for i, a in enumerate(actions):
            live[slot[a.stage]] += 1 if a.kind == "F" else -1
            if a.kind == "F" and (i + 1 == len(actions) or actions[i + 1].kind == "B"):
                found.add(tuple(live))
        # keep the vectors no other one dominates; a dominating vector has at least the same total
        kept: list[tuple[int, ...]] = []
        for vec in sorted(found, key=lambda v: (-sum(v), v)):
            if not any(all(x >= y for x, y in zip(w, vec)) for w in kept):
                kept.append(vec)
        peaks[rank] = [{st: c for st, c in zip(stages, vec) if c} for vec in kept]
    if len(_PEAKS) > 4096:
        _PEAKS.clear()
    _PEAKS[id(orders)] = (orders, peaks)
    return peaks
