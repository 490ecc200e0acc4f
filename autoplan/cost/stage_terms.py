"""Stage durations, rank memory and end-of-step work as linear expressions in the layout variables.

Layout variables, per stage s: ``("n", s)`` layers, ``("sel", s)`` of them selectively recomputed,
``("full", s)`` fully recomputed. The evaluator substitutes numbers. The search reads the same terms
compiled to integers per rank (layout_terms.py), which tests check against these expressions layout by
layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.stage_table import StageTable

Var = tuple[str, int]


@dataclass(frozen=True)
class Linear:
    """sum(coef * var) + const, integers throughout."""

    coefs: dict[Var, int]
    const: int = 0

    def value(self, values: dict[Var, int]) -> int:
        return self.const + sum(c * values[v] for v, c in self.coefs.items())

    def __add__(self, other: "Linear") -> "Linear":
        coefs = dict(self.coefs)
        for v, c in other.coefs.items():
            coefs[v] = coefs.get(v, 0) + c
        return Linear(coefs, self.const + other.const)

    def scaled(self, k: int) -> "Linear":
        return Linear({v: c * k for v, c in self.coefs.items()}, self.const * k)


def _per_table(fn):
    """Memoise an expression per (table, index): the evaluator asks for the same few thousands of times."""
    def cached(t: StageTable, i: int):
        key = (fn, i)
        memo = t.expressions
        if key not in memo:
            memo[key] = fn(t, i)
        return memo[key]

    cached.__doc__, cached.__name__ = fn.__doc__, fn.__name__
    return cached


@_per_table
def stage_fwd(t: StageTable, s: int) -> Linear:
    const = (t.embedding.fwd_ns + t.dense.fwd_ns if s == 0 else 0) + (t.head.fwd_ns if s == t.num_stages - 1 else 0) \
        + t.action_fwd_ns
    return Linear({("n", s): t.block.fwd_ns}, const)


@_per_table
def stage_wgt(t: StageTable, s: int) -> Linear:
    """Of ``stage_bwd``, the weight backward (a zero-bubble schedule's ``W``): the blocks' and the head's
    weight-gradient GEMMs and the embedding's whole backward (its input, token ids, has no gradient).
    Recomputation reruns the forward when the input gradient is computed, so it stays in ``I``. Stage 0's
    leading dense blocks (MoE models, stage_table.py) add their weight-gradient GEMMs."""
    const = (t.embedding.bwd_ns + t.dense.wgt_ns if s == 0 else 0) + (t.head.wgt_ns if s == t.num_stages - 1 else 0)
    return Linear({("n", s): t.block.wgt_ns, ("full", s): t.full_extra_weight_ns}, const)


@_per_table
def stage_bwd(t: StageTable, s: int) -> Linear:
    const = (t.embedding.bwd_ns + t.dense.bwd_ns if s == 0 else 0) + (t.head.bwd_ns if s == t.num_stages - 1 else 0) \
        + t.action_bwd_ns
    full = t.full_extra_ns + t.full_extra_weight_ns  # the weight backward's reruns (split backwards only)
    return Linear({("n", s): t.block.bwd_ns, ("sel", s): t.selective_extra_ns, ("full", s): full}, const)


def _per_rank(t: StageTable, rank: int, block: int, embedding: int, head: int) -> Linear:
    """``block`` per MoE (or every) block of the rank's stages, ``embedding`` on stage 0 (with its leading
    dense blocks' share, stage_table.py), ``head`` on the last."""
    stages = t.stages_of(rank)
    const = (embedding if 0 in stages else 0) + (head if t.num_stages - 1 in stages else 0)
    return Linear({("n", s): block for s in stages}, const)


@_per_table
def rank_states(t: StageTable, rank: int) -> Linear:
    """Weights, gradients and optimizer state the rank holds for the whole step (bytes); its stages' whole
    gradients, live for part of it, are ``stage_whole_grads``."""
    return _per_rank(t, rank, t.block_state_bytes, t.embedding_state_bytes + t.dense_state_bytes, t.head_state_bytes)


@_per_table
def stage_whole_grads(t: StageTable, s: int) -> Linear:
    """Bytes of stage s's gradients accumulated whole (0 unless the table's stack keeps them whole,
    stage_table.whole_grads): held only at the memory peaks where they are live (simulate.memory_peaks)."""
    const = (t.embedding_grad_bytes + t.dense_grad_bytes if s == 0 else 0) \
        + (t.head_grad_bytes if s == t.num_stages - 1 else 0)
    return Linear({("n", s): t.block_grad_bytes}, const)


@_per_table
def stage_activations(t: StageTable, s: int) -> Linear:
    """Bytes one micro-batch leaves on stage s until its backward."""
    const = (t.embedding_act_bytes + t.dense_act_bytes if s == 0 else 0) \
        + (t.head_act_bytes if s == t.num_stages - 1 else 0)
    return Linear({("n", s): t.block_act_bytes,
                   ("sel", s): t.block_act_selective_bytes - t.block_act_bytes,
                   ("full", s): t.block_act_full_bytes - t.block_act_bytes}, const)


@_per_table
def rank_fixed_dynamic(t: StageTable, rank: int) -> int:
    """Working memory that does not depend on the layout: ZeRO-3 buffers, and the larger of the loss's
    logits and a block's ring attention buffers (never live at once: the loss runs after the last block)."""
    stages = t.stages_of(rank)
    last = t.num_stages - 1 in stages
    dense = t.dense_transient_bytes if 0 in stages else 0  # a recomputed leading dense block, rebuilt
    return t.zero3_buffer_bytes + max(t.ring_transient_bytes, t.logits_transient_bytes if last else 0) + dense


@_per_table
def rank_sync(t: StageTable, rank: int) -> Linear:
    """Gradient reduction over dp x cp, and the experts' over edp (ns): all-reduce for ZeRO-0, reduce-scatter
    otherwise."""
    if not t.reduces:
        return Linear({})
    expr = _per_rank(t, rank, t.sync_block_ns, t.sync_embedding_ns + t.dense_sync_ns, t.sync_head_ns)
    return Linear(expr.coefs, expr.const + t.sync_latency_ns)


@_per_table
def rank_before_sync(t: StageTable, rank: int) -> Linear:
    """Work between the rank's exposed gradient reduction and the step's first all-rank collective (ns): the
    tied embedding's gradient exchange between the first and the last pipeline rank."""
    stages = t.stages_of(rank)
    return Linear({}, t.tied_sync_ns if (0 in stages or t.num_stages - 1 in stages) else 0)


@_per_table
def rank_after_sync(t: StageTable, rank: int) -> Linear:
    """ZeRO-1/2 all-gather of updated weights, the optimizer step and the runtime's per-step small
    collectives (ns, where the cluster prices them): after the gradient norm's all-reduce over every rank,
    so they start together on all ranks (cost/evaluate.py's sync point), never hidden."""
    gather = _per_rank(t, rank, t.gather_block_ns, t.gather_embedding_ns + t.dense_gather_ns, t.gather_head_ns)
    if t.reduces and t.config.zero_stage in (1, 2):
        gather = Linear(gather.coefs, gather.const + t.gather_latency_ns)
    gather = Linear(gather.coefs, gather.const + t.step_sync_ns)
    return gather + rank_optimizer(t, rank)


@_per_table
def rank_optimizer(t: StageTable, rank: int) -> Linear:
    """The optimizer step of the rank's stages (ns): its share of ``rank_after_sync``."""
    return _per_rank(t, rank, t.optim_block_ns, t.optim_embedding_ns + t.dense_optim_ns, t.optim_head_ns)


@_per_table
def rank_backward_reduce(t: StageTable, rank: int) -> Linear:
    """One micro-batch's gradient reduce-scatters that the rank's backwards do not hide (ns), where ZeRO 2/3
    reduces every micro-batch (stage_table.LayerTimes.reduce_ns): already inside ``stage_bwd``; what the
    step's breakdown calls data-parallel communication."""
    return _per_rank(t, rank, t.block.reduce_ns, t.embedding.reduce_ns + t.dense.reduce_ns, t.head.reduce_ns)
