"""Simulate per-rank pipeline action lists with per-stage durations: step time, idle time, critical path.

Each rank runs its actions in list order, one at a time. A forward of stage s waits for the forward of
stage s-1 on the same micro-batch plus the point-to-point transfer between them; a backward of stage s
waits for the backward of stage s+1 (or, on the last stage, its own forward) plus the transfer. A split
backward (zero-bubble schedules) is an input backward ``I``, which waits like a full backward and is what
stage s-1 waits for, and a weight backward ``W``, which waits for its own ``I`` only. Sends are
asynchronous (they cost the receiver latency, not the sender's compute), as in torch's schedules and
Megatron's. A receive completes no sooner than ``late_receive`` after it is posted (when the receiving
rank's previous action ends), which binds for receives posted after their data was sent: 0 on GPUs; on a
CPU host whose ranks share cores, the measured wait of gloo's sender side for a core
(``Cluster.late_receive_us``). A list that cannot make progress is a deadlock, reported as such.

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
from dataclasses import dataclass, field
from operator import attrgetter

from autoplan.schema.schedule import Action, RankOrders


@dataclass(frozen=True)
class Timeline:
    actions: list[Action]
    """Every action once, in an order that respects all dependencies; the arrays below follow it."""
    ranks: list[int]
    """The pipeline rank that runs each action."""
    start: list[float]
    end: list[float]
    binding: list[tuple[int, bool] | None]
    """For each action, the index of the predecessor whose end determined its start and whether a
    transfer between stages lay in between (None: it started at time 0)."""
    rank_end: dict[int, float]
    """When each rank finishes its last action."""
    last_index: dict[int, int]

    def busy(self, rank: int) -> float:
        return sum(self.end[i] - self.start[i] for i, r in enumerate(self.ranks) if r == rank)


@dataclass(frozen=True)
class CriticalPath:
    forwards: Counter
    """Forward actions per stage on the path."""
    backwards: Counter
    """Full backward actions per stage on the path."""
    transfers: Counter
    """Point-to-point transfers per edge (s, s+1) on the path, either direction."""
    end_rank: int
    inputs: Counter = field(default_factory=Counter)
    """Input backward (``I``) actions per stage on the path."""
    weights: Counter = field(default_factory=Counter)
    """Weight backward (``W``) actions per stage on the path."""


_microbatch = attrgetter("microbatch")

SLOTS = {"F": 0, "B": 1, "I": 2, "W": 3}
"""Duration slot of an action of stage s: SLOTS[kind] x num_stages + s."""


@dataclass(frozen=True)
class Compiled:
    """The actions in an order that respects every dependency, each as a row (rank predecessor,
    dependency 1, its transfer edge, dependency 2, its edge, duration slot): indices into this order, -1
    for "none" (index -1 of the end-time list and of the transfer list holds 0); slot s is the forward
    of stage s, slot num_stages + s its full backward, 2 num_stages + s its input backward, 3 num_stages
    + s its weight backward."""

    actions: list[Action]
    ranks: list[int]
    rows: list[tuple[int, int, int, int, int, int]]
    last_index: dict[int, int]


def simulate(orders: RankOrders, fwd_s: list[float], bwd_s: list[float], p2p_s: list[float],
             late_receive_s: float = 0.0, wgt_s: list[float] | None = None) -> Timeline:
    """``fwd_s[s]``/``bwd_s[s]``: durations of stage s (``bwd_s``: the full backward); ``wgt_s[s]``: of the
    full backward, the weight backward's share (a split backward's ``I`` takes the rest; None: 0);
    ``p2p_s[s]``: transfer time between s and s+1; ``late_receive_s``: the least time from posting a
    receive to its completion (module doc)."""
    g = compiled(orders, len(fwd_s))
    n = len(g.rows)
    durations = slot_durations(fwd_s, bwd_s, wgt_s)
    start, end = [0.0] * n, [0.0] * n
    binding: list[tuple[int, bool] | None] = [None] * n
    for i, (p, d1, e1, d2, e2, slot) in enumerate(g.rows):
        ready, why = (end[p], (p, False)) if p >= 0 else (0.0, None)
        if late_receive_s and (e1 >= 0 or e2 >= 0):  # the action receives: it waits at least that long
            ready += late_receive_s
        for d, edge in ((d1, e1), (d2, e2)):
            if d < 0:
                continue
            t = end[d] + (p2p_s[edge] if edge >= 0 else 0.0)
            if t > ready:
                ready, why = t, (d, edge >= 0)
        start[i] = ready
        end[i] = ready + durations[slot]
        binding[i] = why
    rank_end = {r: end[i] for r, i in g.last_index.items()}
    return Timeline(g.actions, g.ranks, start, end, binding, rank_end, g.last_index)


def slot_durations(fwd: list, bwd: list, wgt: list | None) -> list:
    """The duration of every slot (``SLOTS``): forward, full backward, input backward, weight backward."""
    wgt = list(wgt) if wgt is not None else [0] * len(fwd)
    return list(fwd) + list(bwd) + [b - w for b, w in zip(bwd, wgt)] + wgt


_COMPILED: dict[int, tuple[RankOrders, Compiled]] = {}


def compiled(orders: RankOrders, num_stages: int) -> Compiled:
    """The dependency graph of the lists, built once per schedule object (build_schedule caches those)
    and reused: it depends on the action order only, not on durations. A deadlock is found here.

    A forward of stage s waits for the forward of s - 1 on the same micro-batch; a backward (full or
    input) for the backward (full or input) of s + 1 (on the last stage: nothing but its own forward) and
    its own forward; a weight backward for its own input backward.
    """
    cached = _COMPILED.get(id(orders))
    if cached is not None and cached[0] is orders:
        return cached[1]
    # every action gets an integer id from (stage, kind, micro-batch); lists indexed by it are far cheaper
    # than dictionaries of dataclasses, which matters for lists of 10^5 actions. Id -1 is "no dependency".
    # ids: 3 per (stage, micro-batch): its forward, its backward (full or input: what stage s - 1 waits
    # for), its weight backward
    span = 1 + max((max(map(_microbatch, acts)) for acts in orders.values() if acts), default=0)
    for rank, acts in orders.items():
        for a in acts:
            if not 0 <= a.stage < num_stages or a.microbatch < 0:
                raise RuntimeError(f"pipeline schedule: rank {rank} runs {a}, outside {num_stages} stages")
    step, last_stage = 3 * span, num_stages - 1
    kind_slot = {kind: k * num_stages for kind, k in SLOTS.items()}
    index = [-1] * (step * num_stages) + [0]  # the last entry answers for id -1: always "done"
    out: list[tuple[int, int, int, int, int, int]] = []
    emit = out.append
    runs: list[tuple[int, int, int]] = []  # (rank, first, end): the list positions each visit placed
    cursor = dict.fromkeys(orders, 0)
    last = dict.fromkeys(orders, -1)
    blocked = dict.fromkeys(orders, -1)  # the id a rank last stopped at: skip the rank while it is not placed
    i, total = 0, sum(len(a) for a in orders.values())
    while i < total:  # visit the ranks in turn, each as far as its dependencies allow
        progressed = False
        for rank, acts in orders.items():
            b = blocked[rank]
            if b >= 0 and index[b] < 0:
                continue
            first = c = cursor[rank]
            n, previous = len(acts), last[rank]
            while c < n:
                a = acts[c]
                s, kind = a.stage, a.kind
                f_id = step * s + a.microbatch
                if kind == "F":  # the forward of s - 1 on the same micro-batch, across edge s - 1
                    key, dep = f_id, f_id - step
                    if s == 0:
                        row = (previous, -1, -1, -1, -1, s)
                    elif index[dep] < 0:
                        break
                    else:
                        row = (previous, index[dep], s - 1, -1, -1, s)
                elif kind == "W":  # its own input backward
                    key, dep = f_id + 2 * span, f_id + span
                    if index[dep] < 0:
                        break
                    row = (previous, index[dep], -1, -1, -1, kind_slot["W"] + s)
                elif s == last_stage:  # its own forward
                    key, dep = f_id + span, f_id
                    if index[dep] < 0:
                        break
                    row = (previous, index[dep], -1, -1, -1, kind_slot[kind] + s)
                else:  # the backward of s + 1 across edge s, and its own forward
                    key = f_id + span
                    dep = key + step if index[key + step] < 0 else f_id
                    if index[dep] < 0:
                        break
                    row = (previous, index[key + step], s, index[f_id], -1, kind_slot[kind] + s)
                index[key] = i
                emit(row)
                previous = i
                i += 1
                c += 1
            else:
                dep = -1
            blocked[rank] = dep
            if c > first:
                progressed = True
                runs.append((rank, first, c))
                cursor[rank], last[rank] = c, previous
        if not progressed:
            stuck = {r: str(a[cursor[r]]) for r, a in orders.items() if cursor[r] < len(a)}
            raise RuntimeError(f"pipeline schedule deadlocks; next actions per rank: {stuck}")
    actions: list[Action] = []
    ranks: list[int] = []
    for rank, first, end in runs:
        actions += orders[rank][first:end]
        ranks += [rank] * (end - first)
    result = Compiled(actions, ranks, out, {r: last[r] for r, acts in orders.items() if acts})
    if len(_COMPILED) > 4096:
        _COMPILED.clear()
    _COMPILED[id(orders)] = (orders, result)
    return result


def data_dependencies(action: Action, num_stages: int) -> list[Action]:
    """The actions whose outputs ``action`` consumes, the rule ``compiled`` encodes as integer rows; a
    dependency on another stage crosses the transfer edge ``min(stage, other stage)``. For the trace views
    (report/chrome_trace.py), which draw the transfers the simulation charged."""
    s, mb = action.stage, action.microbatch
    if action.kind == "F":
        return [Action(s - 1, "F", mb)] if s > 0 else []
    if action.kind == "W":
        return [Action(s, "I", mb)]
    if s == num_stages - 1:
        return [Action(s, "F", mb)]
    return [Action(s + 1, "B", mb), Action(s, "F", mb)]  # the next stage's "B" or, split, its "I"


def rank_ends(c: Compiled, fwd: list[int], bwd: list[int], p2p: list[int], late_receive: int = 0,
              wgt: list[int] | None = None) -> dict[int, int]:
    """When each rank's last action ends: the same recurrence as ``simulate``, on integers (ns)."""
    durations = slot_durations(fwd, bwd, wgt)
    transfer = list(p2p) + [0]
    end = [0] * (len(c.rows) + 1)
    if not late_receive:  # the common case, without the receive test
        for i, (prev, d1, e1, d2, e2, slot) in enumerate(c.rows):
            t, u, v = end[prev], end[d1] + transfer[e1], end[d2] + transfer[e2]
            if u > t:
                t = u
            end[i] = (v if v > t else t) + durations[slot]
        return {r: end[i] for r, i in c.last_index.items()}
    for i, (prev, d1, e1, d2, e2, slot) in enumerate(c.rows):
        t = end[prev] + late_receive if late_receive and (e1 >= 0 or e2 >= 0) else end[prev]
        u = end[d1] + transfer[e1]
        if u > t:
            t = u
        u = end[d2] + transfer[e2]
        if u > t:
            t = u
        end[i] = t + durations[slot]
    return {r: end[i] for r, i in c.last_index.items()}


def critical_path(timeline: Timeline, rank: int) -> CriticalPath:
    """The chain of binding predecessors that ends with ``rank``'s last action."""
    counts: dict[str, Counter] = {kind: Counter() for kind in SLOTS}
    transfers: Counter = Counter()
    i: int | None = timeline.last_index[rank]
    while i is not None:
        action = timeline.actions[i]
        counts[action.kind][action.stage] += 1
        binding = timeline.binding[i]
        if binding is None:
            break
        j, crosses = binding
        if crosses:
            transfers[min(action.stage, timeline.actions[j].stage)] += 1
        i = j
    return CriticalPath(counts["F"], counts["B"], transfers, rank, counts["I"], counts["W"])


_PEAKS: dict[int, tuple[RankOrders, dict]] = {}


def inflight_peaks(orders: RankOrders) -> dict[int, list[dict[int, int]]]:
    """Per rank, the micro-batches each of its stages holds at every local peak of activation memory.

    A forward adds one micro-batch's activations to its stage, a full backward frees them; of a split one,
    the input backward frees nothing (the weight backward still needs each layer's input) and the weight
    backward frees them all. Peaks occur right after a forward that is followed by another kind of action
    (or ends the list). The order on a rank is fixed, so
    these counts do not depend on durations: memory = max over the returned vectors of
    sum(count[s] * bytes_per_microbatch[s]), which is linear in the stage layouts for each vector.
    """
    cached = _PEAKS.get(id(orders))
    if cached is not None and cached[0] is orders:
        return cached[1]
    # memory_peaks walks the same events; its extra candidates (after a first backward) hold no more
    # micro-batches than the forward before them, so the activation counts alone reduce to these peaks
    peaks: dict[int, list[dict[int, int]]] = {}
    for rank, candidates in memory_peaks(orders).items():
        stages = sorted({a.stage for a in orders[rank]})
        counts = {tuple(p.counts.get(st, 0) for st in stages) for p in candidates}
        peaks[rank] = [{st: c for st, c in zip(stages, vec) if c} for vec in _undominated(counts)]
    if len(_PEAKS) > 4096:
        _PEAKS.clear()
    _PEAKS[id(orders)] = (orders, peaks)
    return peaks


def _undominated(found: set[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The vectors no other one dominates (at least as large in every entry), largest total first: a
    dominating vector has at least the same total, so one pass in that order suffices."""
    kept: list[tuple[int, ...]] = []
    for vec in sorted(found, key=lambda v: (-sum(v), v)):
        if not any(all(x >= y for x, y in zip(w, vec)) for w in kept):
            kept.append(vec)
    return kept


@dataclass(frozen=True)
class MemoryPeak:
    """One candidate peak of a rank's memory: the micro-batches each stage holds (``counts``, stages
    holding none left out), the stages whose whole gradients are live (``whole_grads``) and, where the stack
    keeps them, the last stage's outputs kept so far (``kept_outputs``: its forwards completed on the rank)."""

    counts: dict[int, int]
    whole_grads: frozenset[int]
    kept_outputs: int = 0


_MEMORY_PEAKS: dict[tuple[int, bool], tuple[RankOrders, dict]] = {}


def memory_peaks(orders: RankOrders, keeps_outputs: bool = False) -> dict[int, list[MemoryPeak]]:
    """Per rank, its candidate memory peaks as events over its action list: the activations ``inflight_peaks``
    counts and which of its stages hold their gradients whole.

    On a stack that accumulates a stage's gradients whole until one reduction (torch's schedule runtime with
    FSDP2 at ZeRO 2/3, stage_table.whole_grads) they appear with the stage's first gradient-creating backward
    (a full backward ``B``, or of a split one the weight backward ``W``: the input backward ``I`` computes
    input gradients only, torch/distributed/pipelining/stage.py stage_backward_input) and are freed by the
    reduce-scatter right after its last one (schedules.py ``_add_reduce_grad`` places ``REDUCE_GRAD`` after
    a stage's m-th ``B``/``W``; ``perform_reduce_grad`` runs FSDP2's post_backward, which reduces and frees
    the unsharded gradients). Candidate points: after every forward followed by another kind of action (or
    ending the list), where activations peak, and right after each stage's first gradient-creating backward,
    where its gradients appear while activations drop by one micro-batch only.

    With ``keeps_outputs`` (StackProfile.pipeline_keeps_outputs) each forward of the last stage adds one
    micro-batch's output that stays until the step ends, so a peak also counts the last-stage forwards
    completed before it. Those candidates still suffice: the kept outputs grow only at forwards, so between
    two candidates memory only falls (a backward frees activations and keeps the outputs; the point after a
    rank's last action, where the outputs peak, holds no more than the point after its last forward, which has
    all of them and at least that micro-batch's activations). The order on a rank is fixed, so these do not
    depend on durations; a candidate another one dominates (no fewer micro-batches on any stage, no fewer live
    gradients, no fewer kept outputs) is dropped, every term being non-negative."""
    key = (id(orders), keeps_outputs)
    cached = _MEMORY_PEAKS.get(key)
    if cached is not None and cached[0] is orders:
        return cached[1]
    peaks: dict[int, list[MemoryPeak]] = {}
    last = max(a.stage for actions in orders.values() for a in actions)
    for rank, actions in orders.items():
        stages = sorted({a.stage for a in actions})
        slot = {st: i for i, st in enumerate(stages)}
        creating = [0] * len(stages)  # gradient-creating backwards per stage, to know each one's last
        for a in actions:
            if a.kind in "BW":
                creating[slot[a.stage]] += 1
        live, grads, seen = [0] * len(stages), [0] * len(stages), [0] * len(stages)
        kept = [0]  # last-stage outputs kept so far (stays 0 without keeps_outputs)
        found: set[tuple[int, ...]] = set()
        for i, a in enumerate(actions):
            k = slot[a.stage]
            live[k] += 1 if a.kind == "F" else -1 if a.kind in "BW" else 0
            if keeps_outputs and a.kind == "F" and a.stage == last:
                kept[0] += 1
            if a.kind == "F" and (i + 1 == len(actions) or actions[i + 1].kind != "F"):
                found.add(tuple(live) + tuple(grads) + tuple(kept))
            if a.kind in "BW":
                seen[k] += 1
                if seen[k] == 1:
                    grads[k] = 1
                    found.add(tuple(live) + tuple(grads) + tuple(kept))
                if seen[k] == creating[k]:
                    grads[k] = 0  # REDUCE_GRAD: reduce-scattered and freed
        n = len(stages)
        peaks[rank] = [MemoryPeak({st: c for st, c in zip(stages, vec[:n]) if c},
                                  frozenset(st for st, g in zip(stages, vec[n:2 * n]) if g), vec[2 * n])
                       for vec in _undominated(found)]
    if len(_MEMORY_PEAKS) > 4096:
        _MEMORY_PEAKS.clear()
    _MEMORY_PEAKS[key] = (orders, peaks)
    return peaks
