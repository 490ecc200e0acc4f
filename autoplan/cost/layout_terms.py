"""The expressions of stage_terms.py compiled to plain integers per rank, for the search's inner loop.

The search evaluates thousands of stage layouts of one configuration; building ``Linear`` dictionaries
for each would cost more than the simulation. ``LayoutTerms`` takes a table apart once into per-stage and
per-rank integers and evaluates layouts with them: the same integers, the same arithmetic as
evaluate.py (``fits`` is ``fits_in(rank_memory(...))``, ``step_ns`` is ``evaluate(...).step_ns``), which
tests check layout by layout (tests/planner/test_layout_terms.py) and the brute-force search checks
end to end (it uses evaluate.py only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from autoplan.schema.schedule import RankOrders
from autoplan.cost.simulate import compiled, inflight_peaks, memory_peaks, rank_ends
from autoplan.cost.stage_table import PERMILLE, StageTable


@dataclass(frozen=True)
class RankTerms:
    """Everything about one pipeline rank that does not depend on the layout."""

    rank: int
    stages: tuple[int, ...]
    peaks: tuple[tuple[int, ...], ...]
    """Per memory peak, the micro-batches in flight on each of ``stages`` (same order)."""
    peak_grads: tuple[tuple[int, ...], ...]
    """Per memory peak, 1 for each of ``stages`` whose whole gradients are live there, else 0
    (simulate.memory_peaks; they weigh only where the table has whole gradients)."""
    peak_kept: tuple[int, ...]
    """Per memory peak, the bytes of the last stage's outputs kept there (its forwards completed by then x
    the table's ``kept_output_bytes``; 0 off the last stage's rank or where the stack keeps none): layout-
    independent, with the activations' reserve."""
    grad_const: tuple[int, ...]
    """Whole gradients of the embedding (and leading dense blocks) / head on each of ``stages``; blocks add
    ``block_grad_bytes`` per layer."""
    state_const: int
    """Embedding and head states on this rank and the process baseline (bytes); blocks add
    ``block_state_bytes`` per layer."""
    act_const: tuple[int, ...]
    """Embedding / head activations per micro-batch on each of ``stages``."""
    fixed: int
    """Layout-independent working memory (ZeRO-3 buffers, logits)."""
    sync_const: int
    sync_per_layer: int
    before_const: int
    """The tied embedding's gradient exchange, before the step's sync point (cost/evaluate.py)."""
    after_const: int
    """After the sync point: ZeRO-1/2 all-gather, optimizer step, small collectives; constant part and per
    layer (never hidden)."""
    after_per_layer: int
    window_stage: int | None
    """Stage whose last backward the DP reduction overlaps (None: no overlap)."""
    window_weight: bool
    """That last action is a weight backward (zero-bubble schedules): the window is its ``W``."""
    first_stage: int
    """Stage of the rank's first action (a forward) and of its last one (a backward)."""
    last_stage: int
    last_input_stage: int
    """Stage of the rank's last full or input backward (``last_stage`` unless the schedule splits them)."""


class LayoutTerms:
    def __init__(self, t: StageTable):
        self.table = t
        S, last = t.num_stages, t.num_stages - 1
        self.num_stages = S
        self.num_microbatches = t.config.num_microbatches
        # stage 0 holds the embedding and a MoE model's leading dense blocks (stage_table.py)
        self.fwd_const = [(t.embedding.fwd_ns + t.dense.fwd_ns if s == 0 else 0) + (t.head.fwd_ns if s == last else 0)
                          + t.action_fwd_ns for s in range(S)]
        self.bwd_const = [(t.embedding.bwd_ns + t.dense.bwd_ns if s == 0 else 0) + (t.head.bwd_ns if s == last else 0)
                          + t.action_bwd_ns for s in range(S)]
        self.block_fwd, self.block_bwd, self.block_wgt = t.block.fwd_ns, t.block.bwd_ns, t.block.wgt_ns
        self.split = t.split_backward
        self.wgt_const = [(t.embedding.bwd_ns + t.dense.wgt_ns if s == 0 else 0) + (t.head.wgt_ns if s == last else 0)
                          for s in range(S)]  # stage_terms.stage_wgt
        self.sel_ns, self.full_ns = t.selective_extra_ns, t.full_extra_ns + t.full_extra_weight_ns
        self.full_weight_ns = t.full_extra_weight_ns
        self.act = t.block_act_bytes
        self.d_sel = t.block_act_bytes - t.block_act_selective_bytes
        """Bytes a selectively recomputed layer saves per micro-batch, and what it needs while it rebuilds."""
        self.d_full = t.block_act_bytes - t.block_act_full_bytes
        self.capacity_scaled = PERMILLE * t.capacity_bytes
        self.p2p = list(t.p2p_ns)
        self.late_receive = t.late_receive_ns
        # without whole gradients or kept outputs the activation peaks alone (fewer vectors, the same maximum:
        # every candidate after a backward holds no more micro-batches than the forward before it)
        self.whole_grads = any((t.block_grad_bytes, t.embedding_grad_bytes, t.head_grad_bytes, t.dense_grad_bytes))
        self.events = self.whole_grads or t.kept_output_bytes > 0
        """Memory peaks as simulate.memory_peaks's events (whole gradients, kept outputs), not activations only."""
        stages_by_rank = tuple(tuple(t.stages_of(r)) for r in range(t.config.pp))
        shapes = _schedule_shapes(t.orders, stages_by_rank, self.whole_grads, t.kept_output_bytes > 0)
        reduces = t.reduces  # some gradient is reduced over ranks (dp x cp, or the experts' edp)
        gather_latency = t.gather_latency_ns if reduces and t.config.zero_stage in (1, 2) else 0
        self.memo: dict = {}
        """Per-rank answers that splits of this configuration share (the search's recompute bounds)."""
        self.ranks: list[RankTerms] = []
        self.block_grad = t.block_grad_bytes
        for r, (stages, peaks, peak_grads, kept, first_stage, last_stage, last_input_stage) in enumerate(shapes):
            first, has_last = 0 in stages, last in stages
            self.ranks.append(RankTerms(
                rank=r, stages=stages, peaks=peaks, peak_grads=peak_grads,
                peak_kept=tuple(k * t.kept_output_bytes if has_last else 0 for k in kept),
                grad_const=tuple((t.embedding_grad_bytes + t.dense_grad_bytes if s == 0 else 0)
                                 + (t.head_grad_bytes if s == last else 0) for s in stages),
                state_const=(t.embedding_state_bytes + t.dense_state_bytes if first else 0)
                + (t.head_state_bytes if has_last else 0) + t.baseline_bytes,
                act_const=tuple((t.embedding_act_bytes + t.dense_act_bytes if s == 0 else 0)
                                + (t.head_act_bytes if s == last else 0) for s in stages),
                fixed=t.zero3_buffer_bytes + max(t.ring_transient_bytes, t.logits_transient_bytes if has_last else 0)
                + (t.dense_transient_bytes if first else 0),
                sync_const=((t.sync_embedding_ns + t.dense_sync_ns if first else 0)
                            + (t.sync_head_ns if has_last else 0) + t.sync_latency_ns) if reduces else 0,
                sync_per_layer=t.sync_block_ns if reduces else 0,
                before_const=t.tied_sync_ns if first or has_last else 0,
                after_const=(t.gather_embedding_ns + t.optim_embedding_ns + t.dense_gather_ns + t.dense_optim_ns
                             if first else 0)
                + (t.gather_head_ns + t.optim_head_ns if has_last else 0) + gather_latency + t.step_sync_ns,
                after_per_layer=t.gather_block_ns + t.optim_block_ns,
                window_stage=last_stage if t.overlap_grad_reduce else None,
                window_weight=t.last_is_weight(r),
                first_stage=first_stage, last_stage=last_stage, last_input_stage=last_input_stage,
            ))

    # memory -----------------------------------------------------------------------------------------------

    def transient(self, any_selective: bool, any_full: bool) -> int:
        return (self.d_full if any_full else 0) + (self.d_sel if any_selective else 0)

    def excess(self, rank: RankTerms, n: Sequence[int], sel: Sequence[int], full: Sequence[int]) -> int:
        """PERMILLE x (bytes over capacity) of the rank with these per-stage counts (aligned with
        ``rank.stages``); <= 0 means it fits. Same integers as evaluate.fits_in(rank_memory(...))."""
        states = rank.state_const + self.table.block_state_bytes * sum(n)
        per_stage = [k * self.act - a * self.d_sel - b * self.d_full + c
                     for k, a, b, c in zip(n, sel, full, rank.act_const)]
        scale = PERMILLE + self.table.reserve_permille
        if self.events:
            peak = max(self.peak_values(rank, n, per_stage, scale), default=0)
        else:
            peak = scale * max((sum(c * x for c, x in zip(vec, per_stage)) for vec in rank.peaks), default=0)
        return (PERMILLE * states + peak + scale * (self.transient(any(sel), any(full)) + rank.fixed)
                - self.capacity_scaled)

    def stage_grads(self, rank: RankTerms, n: Sequence[int]) -> list[int]:
        """Whole-gradient bytes of each of the rank's stages with ``n`` layers (0 without whole gradients)."""
        return [k * self.block_grad + c for k, c in zip(n, rank.grad_const)]

    def peak_values(self, rank: RankTerms, n: Sequence[int], per_stage: Sequence[int], scale: int) -> list[int]:
        """Per memory peak, PERMILLE x its whole gradients + ``scale`` x its activations (``per_stage``: one
        micro-batch's activations per stage) and kept outputs: the part of ``excess`` that differs between
        peaks."""
        if not self.events:
            return [scale * sum(c * x for c, x in zip(vec, per_stage)) for vec in rank.peaks]
        grads = self.stage_grads(rank, n)
        return [PERMILLE * sum(g for g, on in zip(grads, live) if on)
                + scale * (sum(c * x for c, x in zip(vec, per_stage)) + kept)
                for vec, live, kept in zip(rank.peaks, rank.peak_grads, rank.peak_kept)]

    def fits(self, rank: RankTerms, n: Sequence[int], sel: Sequence[int], full: Sequence[int]) -> bool:
        return self.excess(rank, n, sel, full) <= 0

    # time -------------------------------------------------------------------------------------------------

    def stage_times(self, n: Sequence[int], sel: Sequence[int], full: Sequence[int]) -> tuple[list[int], list[int]]:
        """Per-stage forward and backward durations (ns) of one micro-batch, for per-stage counts."""
        fwd = [k * self.block_fwd + c for k, c in zip(n, self.fwd_const)]
        bwd = [k * self.block_bwd + a * self.sel_ns + b * self.full_ns + c
               for k, a, b, c in zip(n, sel, full, self.bwd_const)]
        return fwd, bwd

    def stage_weights(self, n: Sequence[int], full: Sequence[int] | None = None) -> list[int]:
        """Per-stage weight backward (``W``) of one micro-batch, with ``full`` fully recomputed layers per
        stage (None: none); zeros unless the schedule splits backwards."""
        if not self.split:
            return [0] * len(n)
        full = full if full is not None else [0] * len(n)
        return [k * self.block_wgt + b * self.full_weight_ns + c for k, b, c in zip(n, full, self.wgt_const)]

    def before_sync_ns(self, rank: RankTerms, layers: int, bwd: Sequence[int], wgt: Sequence[int]) -> int:
        """Work after the rank's last backward up to the step's sync point: exposed DP reduction, tied grads."""
        sync = rank.sync_const + rank.sync_per_layer * layers
        window = 0
        if rank.window_stage is not None:
            window = (wgt if rank.window_weight else bwd)[rank.window_stage]
        return max(0, sync - window) + rank.before_const

    def step_ns(self, n: Sequence[int], sel: Sequence[int], full: Sequence[int]) -> tuple[int, int]:
        """(step time, critical rank) of the layout: the schedule simulated, each rank's work up to the sync
        point, then the largest after-sync work (the same integers as evaluate.evaluate)."""
        fwd, bwd = self.stage_times(n, sel, full)
        wgt = self.stage_weights(n, full)
        ends = rank_ends(compiled(self.table.orders, self.num_stages), fwd, bwd, self.p2p, self.late_receive, wgt)
        best, critical, sync, after_max = -1, 0, 0, 0
        for rank in self.ranks:
            layers = sum(n[s] for s in rank.stages)
            before = ends[rank.rank] + self.before_sync_ns(rank, layers, bwd, wgt)
            after = rank.after_const + rank.after_per_layer * layers
            sync, after_max = max(sync, before), max(after_max, after)
            if before + after > best:
                best, critical = before + after, rank.rank
        return sync + after_max, critical


_SHAPES: dict[tuple[int, bool, bool], tuple[RankOrders, list]] = {}


def _schedule_shapes(orders: RankOrders, stages_by_rank: tuple[tuple[int, ...], ...],
                     whole_grads: bool, keeps_outputs: bool) -> list:
    """Per rank: its stages, its memory peaks as counts per stage, whole-gradient flags per stage and kept
    last-stage outputs (with ``whole_grads`` or ``keeps_outputs``, memory_peaks; otherwise the activation
    peaks, inflight_peaks, no flags and no outputs), the stages of its first and last action. Depends on the
    action lists only, so configurations sharing a schedule share it."""
    key = (id(orders), whole_grads, keeps_outputs)
    cached = _SHAPES.get(key)
    if cached is not None and cached[0] is orders:
        return cached[1]
    shapes = []
    if whole_grads or keeps_outputs:
        peaks = memory_peaks(orders, keeps_outputs)
        counts = [[p.counts for p in peaks[r]] for r in range(len(stages_by_rank))]
        flags = [[p.whole_grads for p in peaks[r]] for r in range(len(stages_by_rank))]
        kept = [[p.kept_outputs for p in peaks[r]] for r in range(len(stages_by_rank))]
    else:
        acts = inflight_peaks(orders)
        counts = [acts[r] for r in range(len(stages_by_rank))]
        flags = [[frozenset()] * len(acts[r]) for r in range(len(stages_by_rank))]
        kept = [[0] * len(acts[r]) for r in range(len(stages_by_rank))]
    for r, stages in enumerate(stages_by_rank):
        last_input = next(a.stage for a in reversed(orders[r]) if a.kind in "BI")
        shapes.append((stages, tuple(tuple(vec.get(s, 0) for s in stages) for vec in counts[r]),
                       tuple(tuple(int(s in live) for s in stages) for live in flags[r]), tuple(kept[r]),
                       orders[r][0].stage, orders[r][-1].stage, last_input))
    if len(_SHAPES) > 4096:
        _SHAPES.clear()
    _SHAPES[key] = (orders, shapes)
    return shapes
