"""Lower bounds on step time, from a whole group of configurations down to one stage layout.

They let the search skip what cannot beat the best plans found so far (or cannot fit) without losing
optimality: each bound is at most the simulated step time of every layout below it. Four levels, each
at least as tight as the one above:

* group (tp, cp, pp, dp, sp, micro-batch): every rank runs its forwards and backwards one at a time, so the
  busiest rank works at least the average, m x W / pp, for W the whole model's forward + backward per
  micro-batch with no ZeRO-3 gather and no recomputation.
* configuration (adds ZeRO, offload, schedule): per rank, micro-batch 0 must pass the stages in front
  before the rank starts, and after the rank's last backward those stages still run theirs, so
  T >= sum_{s<r} W_s + m W_r. The layout minimising the largest of these has W_r = R_r / m with
  R_{r+1} = R_r (1 - 1/m), which gives T >= W / (1 - (1 - 1/m)^p) for one stage per rank; with several
  stages per rank the stages in front of rank r are r whole stages of at least ``min_layers`` layers,
  T >= m W / p + (p - 1) / 2 x min_layers x (block forward + backward). The end-of-step work that is never
  hidden adds at least its average over ranks: T >= (m W + tails) / p.
* split (adds the layers per stage): for each rank r, with its first action a forward of stage a and its
  last a backward of stage b (whatever the list), T >= head + busy + tail and
  T >= head + busy + chain + tail of rank 0, where head = the forwards and transfers of stages < a on
  one micro-batch, busy = m x (forward + backward) of r's stages, chain = the backwards and transfers of
  stages < b, and tail = the exposed DP reduction, ZeRO-1/2 gather and optimizer step. Recomputation
  forced by memory enters through its linear-programming lower bound per rank (search/recompute.py), and
  the exposed reduction is bounded as m x R + max(0, sync - window - R), which grows with R.
* layout (adds the recomputation per stage): the same with the exact stage times. Only the simulation is
  exact beyond that.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from autoplan.cost.evaluate import StageShape
from autoplan.cost.host_model import HostModel
from autoplan.cost.layout_terms import LayoutTerms, RankTerms
from autoplan.cost.simulate import compiled, rank_ends
from autoplan.cost.model_states import state_bytes_per_param
from autoplan.cost.stage_table import PERMILLE, StageTable, reserve_permille
from autoplan.cost.workload import Workload
from autoplan.schema import Cluster, TrainingSetup
from autoplan.search.recompute import Pin, lower_bound_ns


def group_lower_bound_ns(workload: Workload, host: HostModel, pp: int, num_microbatches: int,
                         schedules: Sequence[tuple[int, int, bool]]) -> int:
    """``schedules``: (virtual stages, fewest layers of a stage, whether it splits backwards) of each
    schedule the group has; ``host``: the cluster's host model, whose least layer times hold for every
    configuration of the group."""
    block = host.least_layer_times(workload.block)
    work = workload.num_layers * (block.fwd_ns + block.bwd_ns)
    for layer in (workload.embedding, workload.head):
        times = host.least_layer_times(layer)
        work += times.fwd_ns + times.bwd_ns
    pipeline = min(_pipeline_ns(work, block.fwd_ns + block.bwd_ns, num_microbatches, pp, v, least, split,
                                block.fwd_ns) for v, least, split in schedules)
    return int(pipeline * (1 - 1e-9))


def group_can_fit(workload: Workload, cluster: Cluster, training: TrainingSetup, pp: int, dp_cp: int,
                  state_options: Iterable[tuple[int, bool]], least_layers: int) -> bool:
    """False when no configuration of the group fits. Whatever the schedule, every rank holds at its
    peak at least one micro-batch of a stage of at least ``least_layers`` layers, each keeping at least
    the smallest of its recomputation modes' activations; and, with the ZeRO stage and offload that keep
    the least, the rank with the most model states holds at least their average over the pp ranks, and
    the rank with the head holds the head's states, activations and the loss's logits."""
    head = workload.head.params + (workload.tied_copy_params if pp > 1 else 0.0)
    params = workload.num_layers * workload.block.params + workload.embedding.params + head
    per_param = min(state_bytes_per_param(training, zero, dp_cp, offload).total for zero, offload in state_options)
    block = workload.block
    acts = least_layers * min(block.saved_bytes, block.selective_saved_bytes, block.full_saved_bytes)
    capacity = PERMILLE * int(cluster.device.memory_gib * (1 - training.memory_margin) * 2**30)
    scale = PERMILLE + reserve_permille(workload.stack)
    busiest = PERMILLE * params * per_param / pp + scale * acts
    last = PERMILLE * head * per_param + scale * (acts + workload.head.saved_bytes + workload.logits_transient_bytes)
    return busiest <= capacity and last <= capacity


def config_lower_bound_ns(t: StageTable, min_layers: int = 1) -> int:
    c = t.config
    m, p, L = c.num_microbatches, c.pp, t.num_layers
    block = t.block.fwd_ns + t.block.bwd_ns
    work = L * block + t.embedding.fwd_ns + t.embedding.bwd_ns + t.head.fwd_ns + t.head.bwd_ns
    pipeline = _pipeline_ns(work, block, m, p, c.virtual_stages, min_layers, t.split_backward, t.block.fwd_ns)
    if t.split_backward:  # the chain of forwards and input backwards (``_pipeline_ns``)
        x_block = block - t.block.wgt_ns
        x_work = L * x_block + t.embedding.fwd_ns + t.head.fwd_ns + t.head.bwd_ns - t.head.wgt_ns
        pipeline = max(pipeline, _pipeline_ns(x_work, x_block, m, p, c.virtual_stages, min_layers))
    tails = L * (t.gather_block_ns + t.optim_block_ns) + t.gather_embedding_ns + t.gather_head_ns
    tails += t.optim_embedding_ns + t.optim_head_ns
    # floating point on sums of integers: a relative 1e-9 below keeps the bound below the integer truth
    return int(max(pipeline, (m * work + tails) / p) * (1 - 1e-9))


def _pipeline_ns(work: int, block: int, m: int, p: int, v: int, min_layers: int, split: bool = False,
                 block_fwd: int = 0) -> float:
    """The configuration bound's pipeline term (module docstring), at least m x work / p. A schedule that
    splits backwards (zero bubble) may run a rank's weight backwards while the stages in front still run
    their input backwards, so the chain argument after a rank's last action does not hold; the one before
    its first does: rank r starts with the forward of stage r (looped or V placement), after the forwards
    of r stages of at least ``min_layers`` layers, so the average over ranks of (that wait + the rank's
    work) gives T >= m W / p + (p - 1) / 2 x min_layers x block forward (``split``). The chain argument
    holds for the forwards and input backwards alone (every rank's last input backward is of its first
    stage, r: the stages in front still run theirs after it), which the caller gets by passing their work
    as ``work`` and ``block`` without ``split``."""
    if split:
        return m * work / p + (p - 1) / 2 * min_layers * block_fwd
    if v == 1:
        return work / (1 - (1 - 1 / m) ** p) if m > 1 else work
    return max(work, m * work / p + (p - 1) / 2 * min_layers * block)


def states_fit(t: StageTable) -> bool:
    """The busiest rank holds at least the average of the model states (and the process baseline); if that
    alone exceeds capacity, no layout fits."""
    total = t.num_layers * t.block_state_bytes + t.embedding_state_bytes + t.head_state_bytes
    return total / t.config.pp + t.baseline_bytes <= t.capacity_bytes


def split_lower_bound_ns(terms: LayoutTerms, split: Sequence[int], pin: Pin) -> int | None:
    """Bound on every recomputation choice of this split; None when no choice fits some rank."""
    return _relaxed_bound(terms, split, split, pin)


def family_lower_bound_ns(terms: LayoutTerms, splits: Sequence[Sequence[int]], pin: Pin) -> int | None:
    """Bound on every split of the family at once: the split bound's terms grow with the layers of a
    stage (the recomputation bound too: a choice that fits more layers fits fewer), except the overlap
    windows, which are taken at the most layers a stage has in the family. None: no split fits."""
    return _relaxed_bound(terms, *family_range(splits), pin)


def family_range(splits: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """The fewest and the most layers each stage has over the splits."""
    return [min(column) for column in zip(*splits)], [max(column) for column in zip(*splits)]


def simulated_lower_bound_ns(terms: LayoutTerms, low: Sequence[int], high: Sequence[int]) -> int:
    """The schedule simulated with ``low`` layers per stage and no recomputation: every start time is a
    maximum of sums of durations, so it can only grow with the true (longer) durations. Each rank then
    adds at least its tail with the widest overlap window (``high`` layers, all recomputed). This is
    where the bubble of few micro-batches over many stages shows, which no closed form above sees."""
    zeros = [0] * len(low)
    fwd, bwd = terms.stage_times(low, zeros, zeros)
    most = max(terms.sel_ns, terms.full_ns)
    widest = [b + k * most for b, k in zip(terms.stage_times(high, zeros, zeros)[1], high)]
    ends = rank_ends(compiled(terms.table.orders, terms.num_stages), fwd, bwd, terms.p2p, terms.late_receive,
                     terms.stage_weights(low))
    return max(ends[rank.rank] + _tail(rank, sum(low[s] for s in rank.stages), widest, 0) for rank in terms.ranks)


def _relaxed_bound(terms: LayoutTerms, low: Sequence[int], high: Sequence[int], pin: Pin) -> int | None:
    zeros = [0] * len(low)
    fwd, bwd = terms.stage_times(low, zeros, zeros)
    most = max(terms.sel_ns, terms.full_ns)
    window = terms.stage_times(high, zeros, zeros)[1]
    widest = [b + k * most for b, k in zip(window, high)]
    recompute = []
    memo = terms.memo  # splits of one configuration share most of their ranks' layer counts
    for rank in terms.ranks:
        key = ("recompute bound", rank.rank, pin, tuple(low[s] for s in rank.stages))
        if key not in memo:
            memo[key] = lower_bound_ns(terms, rank, key[3], pin)
        r = memo[key]
        if r is None:
            return None
        recompute.append(r)
    return _pipeline_bound(terms, low, fwd, bwd, window, widest, recompute)


def layout_lower_bound_ns(terms: LayoutTerms, shapes: Sequence[StageShape]) -> int:
    n = [s.layers for s in shapes]
    full = [s.full for s in shapes]
    fwd, bwd = terms.stage_times(n, [s.selective for s in shapes], full)
    return _pipeline_bound(terms, n, fwd, bwd, bwd, bwd, None, full)


def _pipeline_bound(terms: LayoutTerms, n: Sequence[int], fwd: list[int], bwd: list[int], window: list[int],
                    widest: list[int], recompute: list[int] | None, full: Sequence[int] | None = None) -> int:
    """``n``, ``fwd``, ``bwd``: at most the true layers and stage times, recomputation excluded when
    ``recompute`` holds per-rank lower bounds on it per micro-batch (None: ``bwd`` is exact). ``window``:
    at least each stage's backward without recomputation, for the overlap windows of a rank's own tail,
    where its recomputation bound R enters as m x R + max(0, sync - window - R), which grows with R;
    ``widest``: at least each stage's backward with recomputation, for rank 0's tail, which ends every
    chain."""
    m, p2p = terms.num_microbatches, terms.p2p
    # split backwards: the chain after a rank's last input backward runs the input backwards of the stages
    # in front (at least the low layers' share: it grows with layers), and the rank's busy time up to it
    # leaves out the weight backwards (``_pipeline_ns``)
    inputs = [b - w for b, w in zip(bwd, terms.stage_weights(n, full))] if terms.split else bwd
    head, chain = [0], [0]
    for s in range(terms.num_stages - 1):
        head.append(head[-1] + fwd[s] + p2p[s])
        chain.append(chain[-1] + inputs[s] + p2p[s])

    rank0 = terms.ranks[0]
    tail0 = _tail(rank0, sum(n[s] for s in rank0.stages), widest, 0)
    bound = 0
    for i, rank in enumerate(terms.ranks):
        layers = sum(n[s] for s in rank.stages)
        r = recompute[i] if recompute is not None else 0
        end = head[rank.first_stage] + m * (sum(fwd[s] + bwd[s] for s in rank.stages) + r)
        # split: r may be the weight backward's reruns of a recomputed block, which come after the last input
        # backward; leave it out there
        to_last_input = head[rank.first_stage] + m * (sum(fwd[s] + inputs[s] for s in rank.stages)
                                                      + (0 if terms.split else r))
        bound = max(bound, end + _tail(rank, layers, window, r),
                    to_last_input + chain[rank.last_input_stage] + tail0)
    return bound


def _tail(rank: RankTerms, layers: int, windows: Sequence[int], extra: int) -> int:
    """A rank's end-of-step work with the overlap window ``windows[its window stage] + extra``."""
    sync = rank.sync_const + rank.sync_per_layer * layers
    hidden = windows[rank.window_stage] + extra if rank.window_stage is not None else 0
    return max(0, sync - hidden) + rank.before_const + rank.after_const + rank.after_per_layer * layers
