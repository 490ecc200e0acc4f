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

Before a configuration's schedule lists are built (at large m they cost more than everything else), three
list-free bounds prune it: the busiest rank's own work at the family's fewest layers per stage
(``busiest_rank_ns``), the edge stages' (``edge_stages_ns``: the head and the embedding, with a MoE model's
leading dense blocks and DeepSeek-V3's multi-token-prediction module, weigh several blocks), and per rank
the least recomputation its memory forces (``rank_floors``, from ``least_inflight``: what each schedule's
warm-up is known to hold, checked against ``inflight_peaks`` in tests/planner/test_moe_search.py). The
search applies them to a group too, on a table relaxed to the least memory and time of its configurations
(search/planner.py ``group_floor_ns``).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from autoplan.cost.evaluate import StageShape
from autoplan.cost.host_model import HostModel
from autoplan.cost.layout_terms import LayoutTerms, RankTerms
from autoplan.cost.simulate import compiled, rank_ends
from autoplan.cost.model_states import state_bytes_per_param
from autoplan.cost.stage_table import PERMILLE, StageTable, reserve_permille
from autoplan.cost.workload import Workload, least_exchange
from autoplan.schema import Cluster, TrainingSetup
from autoplan.search.recompute import Pin, per_layer_hull, lower_bound_ns


def group_lower_bound_ns(workload: Workload, host: HostModel, pp: int, num_microbatches: int,
                         schedules: Sequence[tuple[int, int, bool]]) -> int:
    """``schedules``: (virtual stages, fewest layers of a stage, whether it splits backwards[, fewest layers of
    the first stage, of the last]) of each schedule the group has; ``host``: the cluster's host model, whose
    least layer times hold for every configuration of the group. With the edge stages' fewest layers, the
    edge bound holds too (``edge_stages_ns``)."""
    workload = least_exchange(workload)  # a configuration whose stack hides the experts' exchange is faster
    block = host.least_layer_times(workload.block)
    k = workload.dense_layers  # a MoE model's leading dense blocks, on stage 0 (cost/stage_table.py)
    work = (workload.num_layers - k) * (block.fwd_ns + block.bwd_ns)
    first = last = 0
    for layer in (workload.embedding, workload.head) + ((workload.dense_block,) * k if k else ()):
        times = host.least_layer_times(layer)
        work += times.fwd_ns + times.bwd_ns
        if layer is workload.head:
            last += times.fwd_ns + times.bwd_ns
        else:
            first += times.fwd_ns + times.bwd_ns
    m, per_block = num_microbatches, block.fwd_ns + block.bwd_ns

    def bound(v: int, least: int, split: bool, *edges: int) -> float:
        pipeline = _pipeline_ns(work, per_block, m, pp, v, least, split, block.fwd_ns)
        if edges:
            pipeline = max(pipeline, edge_stages_ns(m, first, last, per_block, *edges))
        return pipeline

    return int(min(bound(*shape) for shape in schedules) * (1 - 1e-9))


def edge_stages_ns(m: int, first: int, last: int, per_block: int, first_layers: int, last_layers: int) -> int:
    """Every rank runs each of its stages' m forwards and backwards one at a time, so the rank holding the
    first stage works at least m x (embedding, leading dense blocks and ``first_layers`` blocks) and the one
    holding the last stage m x (head and ``last_layers`` blocks): the average bound misses this where the
    head or the embedding weighs several blocks (a vocabulary of 10^5, DeepSeek-V3's multi-token
    prediction module on the last stage)."""
    return m * max(first + first_layers * per_block, last + last_layers * per_block)


def group_can_fit(workload: Workload, cluster: Cluster, training: TrainingSetup, pp: int, dp_cp: int,
                  state_options: Iterable[tuple[int, bool]], least_layers: int, edp: int = 1) -> bool:
    """False when no configuration of the group fits. Whatever the schedule, every rank holds at its
    peak at least one micro-batch of a stage of at least ``least_layers`` layers, each keeping at least
    the smallest of its recomputation modes' activations; and, with the ZeRO stage and offload that keep
    the least, the rank with the most model states holds at least their average over the pp ranks, and
    the rank with the head holds the head's states, activations and the loss's logits (and under pipelining
    the output it keeps of at least one micro-batch, ``Workload.kept_output_bytes``). Routed-expert
    parameters are sharded over their own ``edp`` ranks (cost/stage_table.py); ``least_layers`` counts the
    blocks the layout places (a MoE model's MoE blocks; its leading dense ones are counted here whole)."""
    head = workload.head.params + (workload.tied_copy_params if pp > 1 else 0.0)
    k, w = workload.dense_layers, workload
    layers = [(w.num_layers - k, w.block), (1, w.embedding)] + ([(k, w.dense_block)] if k else [])
    params = sum(n * layer.params for n, layer in layers) + head
    experts = sum(n * layer.expert_params for n, layer in layers) + w.head.expert_params
    head_experts = w.head.expert_params

    state_options = list(state_options)
    per_param = min(state_bytes_per_param(training, zero, dp_cp, offload).total for zero, offload in state_options)

    def state_bytes(total: float, expert: float) -> float:  # PERMILLE x the least over the ZeRO stages and offload
        if not expert:
            return PERMILLE * total * per_param
        return PERMILLE * min(state_bytes_per_param(training, zero, dp_cp, offload).total * (total - expert)
                              + state_bytes_per_param(training, zero, edp, offload).total * expert
                              for zero, offload in state_options)

    block = workload.block
    acts = least_layers * min(block.saved_bytes, block.selective_saved_bytes, block.full_saved_bytes)
    capacity = PERMILLE * int(cluster.device.memory_gib * (1 - training.memory_margin) * 2**30)
    scale = PERMILLE + reserve_permille(workload.stack)
    busiest = state_bytes(params, experts) / pp + scale * acts
    outputs = workload.kept_output_bytes if pp > 1 else 0.0  # at least the one of its first micro-batch
    last = state_bytes(head, head_experts) + scale * (acts + workload.head.saved_bytes
                                                      + workload.logits_transient_bytes + outputs)
    return busiest <= capacity and last <= capacity


def config_lower_bound_ns(t: StageTable, min_layers: int = 1, edges: tuple[int, int] | None = None) -> int:
    """``edges``: the fewest layers of the first and of the last stage over the splits (``edge_stages_ns``)."""
    c = t.config
    m, p, L = c.num_microbatches, c.pp, t.num_layers
    block = t.block.fwd_ns + t.block.bwd_ns
    dense = t.dense  # a MoE model's leading dense blocks on stage 0 (cost/stage_table.py); zeros otherwise
    work = L * block + t.embedding.fwd_ns + t.embedding.bwd_ns + t.head.fwd_ns + t.head.bwd_ns
    work += dense.fwd_ns + dense.bwd_ns
    pipeline = _pipeline_ns(work, block, m, p, c.virtual_stages, min_layers, t.split_backward, t.block.fwd_ns)
    if t.split_backward:  # the chain of forwards and input backwards (``_pipeline_ns``)
        x_block = block - t.block.wgt_ns
        x_work = L * x_block + t.embedding.fwd_ns + t.head.fwd_ns + t.head.bwd_ns - t.head.wgt_ns
        x_work += dense.fwd_ns + dense.bwd_ns - dense.wgt_ns
        pipeline = max(pipeline, _pipeline_ns(x_work, x_block, m, p, c.virtual_stages, min_layers))
    if edges is not None:
        first = t.embedding.fwd_ns + t.embedding.bwd_ns + dense.fwd_ns + dense.bwd_ns
        pipeline = max(pipeline, edge_stages_ns(m, first, t.head.fwd_ns + t.head.bwd_ns, block, *edges))
    tails = L * (t.gather_block_ns + t.optim_block_ns) + t.gather_embedding_ns + t.gather_head_ns
    tails += t.optim_embedding_ns + t.optim_head_ns + t.dense_gather_ns + t.dense_optim_ns
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
    alone exceeds capacity, no layout fits. Where a stage's gradients accumulate whole (stage_table.whole_grads)
    a rank holds, at the peak after its stage's first gradient-creating backward (simulate.memory_peaks), that
    stage's whole gradients too: at least its stages' share over its ``num_stages / pp`` stages, so the busiest
    rank holds at least the average of states + whole gradients / (stages per rank)."""
    total = t.num_layers * t.block_state_bytes + t.embedding_state_bytes + t.head_state_bytes + t.dense_state_bytes
    grads = t.num_layers * t.block_grad_bytes + t.embedding_grad_bytes + t.head_grad_bytes + t.dense_grad_bytes
    per_rank = t.num_stages // t.config.pp
    return (total + grads / per_rank) / t.config.pp + t.baseline_bytes <= t.capacity_bytes


def busiest_rank_ns(t: StageTable, low: Sequence[int], recompute: Sequence[int] | None = None) -> int:
    """Every rank runs the m forwards and backwards of each of its stages one at a time, so the step takes
    at least the largest over ranks of m x (its stages' work at the family's fewest layers ``low`` + its
    least recomputation per micro-batch, ``recompute``, from ``rank_floors``): the split bound's busy term
    without the schedule's lists (the rank-to-stage placement needs none)."""
    last, m = t.num_stages - 1, t.config.num_microbatches
    block = t.block.fwd_ns + t.block.bwd_ns
    first = t.embedding.fwd_ns + t.embedding.bwd_ns + t.dense.fwd_ns + t.dense.bwd_ns
    head = t.head.fwd_ns + t.head.bwd_ns
    actions = t.action_fwd_ns + t.action_bwd_ns
    return max(m * (sum(low[s] * block + actions + (first if s == 0 else 0) + (head if s == last else 0)
                        for s in t.stages_of(r)) + (recompute[r] if recompute else 0)) for r in range(t.config.pp))


def rank_floors(t: StageTable, low: Sequence[int], pin: Pin) -> list[int] | None:
    """Per rank, a lower bound on the backward time recomputation adds per micro-batch under any split of a
    family whose stage s holds at least ``low[s]`` of the table's blocks; None when some rank cannot fit
    at all. Computed before the schedule's lists are built (they cost most at large m), from what the lists
    are known to hold (``least_inflight``; the rank-to-stage placement needs no lists): a rank's peak holds,
    per stage, its micro-batches in flight times (the stage's constant + its layers x a block's saved bytes
    less what recomputation drops), so its memory is at least each of

    * ``least_inflight`` micro-batches of one of its stages (the smallest once recomputed);
    * on the rank holding stage 0, min(pp, m) micro-batches of stage 0 (every searched schedule warms up
      with that many forwards of stage 0 before its first backward; GPipe holds all m);
    * on the rank holding the last stage, one micro-batch of it, and the loss's logits besides; where the
      stack keeps the last stage's outputs (stage_table ``kept_output_bytes``), all m of them: right after
      its m-th forward that micro-batch is still in flight (simulate.memory_peaks ``kept_outputs``);

    beside its stages' states and the working memory every rank has; recomputing anything adds the
    smallest rebuild buffer (search/recompute.py ``lower_bound_ns``). Each of these constraints alone asks
    for savings whose cheapest fractional cost (each layer's modes convexified) bounds the recomputation
    from below; pinned modes are bounded by 0 (their memory still checked)."""
    modes = [(t.block_act_bytes - x, cost) for x, cost in
             ((t.block_act_selective_bytes, t.selective_extra_ns), (t.block_act_full_bytes,
                                                                    t.full_extra_ns + t.full_extra_weight_ns))
             if t.block_act_bytes - x > 0]
    if pin == "none":
        modes = []
    segments = per_layer_hull(modes) if modes else []
    transient = min((d for d, _ in modes), default=0)
    floors = []
    for r in range(t.config.pp):
        floor = _rank_floor(t, low, r, segments, transient)
        if floor is None:
            return None
        floors.append(0 if pin in ("none", "selective", "full") else floor)
    return floors


def _rank_floor(t: StageTable, low: Sequence[int], r: int, segments: list[tuple[float, int]],
                transient: int) -> int | None:
    c = t.config
    last, m = t.num_stages - 1, c.num_microbatches
    stages = t.stages_of(r)
    states = sum(low[s] for s in stages) * t.block_state_bytes
    fixed = t.zero3_buffer_bytes + t.ring_transient_bytes
    if last in stages:
        states += t.head_state_bytes
        fixed = t.zero3_buffer_bytes + max(t.ring_transient_bytes, t.logits_transient_bytes)
    if 0 in stages:
        states += t.embedding_state_bytes + t.dense_state_bytes
        fixed += t.dense_transient_bytes
    scale = PERMILLE + t.reserve_permille
    room = PERMILLE * (t.capacity_bytes - t.baseline_bytes - states)  # for scale x (activations + fixed)
    # right after a stage's first gradient-creating backward its whole gradients are live (memory_peaks), beside
    # the working memory every peak counts; recomputation cannot shrink them
    if any(PERMILLE * _stage_grad_bytes(t, s, low[s]) + scale * fixed > room for s in stages):
        return None
    kept = {s: low[s] * t.block_act_bytes + (t.embedding_act_bytes + t.dense_act_bytes if s == 0 else 0)
            + (t.head_act_bytes if s == last else 0) for s in stages}
    # (micro-batches, the stages they may be of, bytes beside them no recomputation frees)
    constraints = [(least_inflight(c.schedule, c.pp, c.virtual_stages, m, r), stages, 0)]
    if 0 in stages:
        constraints.append((m if c.schedule == "gpipe" else min(c.pp, m), [0], 0))
    if last in stages:
        constraints.append((1, [last], m * t.kept_output_bytes))
    if all(scale * (count * min(kept[s] for s in subset) + outputs + fixed) <= room
           for count, subset, outputs in constraints):
        return 0
    if not segments:
        return None
    budget = (room / scale - fixed - transient)  # activation bytes the peak may hold once recomputing
    if budget < 0:
        return None
    floor = 0.0
    for count, subset, outputs in constraints:
        if outputs > budget:
            return None
        cost = min(_saving_cost(kept[s] - (budget - outputs) / count, low[s], segments) for s in subset)
        if cost == float("inf"):
            return None
        floor = max(floor, cost)
    return int(floor * (1 - 1e-9))


def _stage_grad_bytes(t: StageTable, s: int, layers: int) -> int:
    """Whole-gradient bytes of stage ``s`` holding ``layers`` of the table's blocks (0 without whole gradients)."""
    return (layers * t.block_grad_bytes + (t.embedding_grad_bytes + t.dense_grad_bytes if s == 0 else 0)
            + (t.head_grad_bytes if s == t.num_stages - 1 else 0))


def _saving_cost(need: float, layers: int, segments: list[tuple[float, int]]) -> float:
    """The cheapest fractional recomputation time that drops ``need`` bytes from one micro-batch of a stage
    of ``layers`` recomputable blocks (inf: more than it can)."""
    cost = 0.0
    for per_byte, saved in segments:
        if need <= 0:
            break
        take = min(need, saved * layers)
        cost += take * per_byte
        need -= take
    return cost if need <= 0 else float("inf")


def least_inflight(schedule: str, pp: int, v: int, m: int, rank: int) -> int:
    """A lower bound on the micro-batch stages ``rank`` holds at the largest of its memory peaks (the largest
    total count over its ``inflight_peaks``), from the warm-up each schedule's list starts with (m >= pp;
    otherwise 1): GPipe all m; 1F1B pp - rank; interleaved (v - 1) pp + 2 (pp - rank - 1) + 1 (Megatron's
    warm-up), at most v m; ZB-H1 v pp (a weight backward frees later); ZB-V pp + 1 + rank, 2 pp from m >= 2 pp;
    DualPipeV 2 pp + 1 from m >= 2 pp. tests/planner/test_moe_search.py checks it against ``inflight_peaks``
    over a grid of pp, v and m."""
    if schedule == "gpipe":
        return m
    if m < pp:
        return 1
    if schedule == "1f1b":
        return pp - rank
    if schedule == "interleaved":
        return min((v - 1) * pp + 2 * (pp - rank - 1) + 1, v * m)
    if schedule == "zb1p":
        return v * pp
    if schedule == "zbv":
        return 2 * pp if m >= 2 * pp else pp + 1 + rank
    if schedule == "dualpipev":
        return 2 * pp + 1 if m >= 2 * pp else 1
    return 1


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
