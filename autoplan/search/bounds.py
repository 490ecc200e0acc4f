"""Lower bounds on a configuration's best step time and memory, computed without simulating it.

They let the search skip configurations that cannot beat the best plan found so far (or cannot fit),
without losing optimality: each bound is below every layout's simulated value.

Pipeline bound, one stage per rank: rank r cannot start before micro-batch 0 has passed the stages in
front of it, then runs its m forwards and backwards, and after its last backward the stages in front
still run theirs, so T >= sum_{s<r} W_s + m W_r for every r, with W_s a stage's forward + backward. The
layout minimising the largest of these has W_r = R_r / m with R_{r+1} = R_r (1 - 1/m), which gives
T >= W / (1 - (1 - 1/m)^p) for a model of total work W per micro-batch: m W / p plus about half the
textbook bubble. With several stages per rank the same argument holds with the stages in front of rank
r being r whole stages of at least ``min_layers`` layers each (the smallest stage the split family
allows): T >= m W / p + (p - 1) / 2 * min_layers * (block forward + backward). Either way the
end-of-step work adds at least its average over ranks: T >= (m W + tails) / p.
"""

from __future__ import annotations

from autoplan.cost.stage_table import StageTable


def step_lower_bound_ns(t: StageTable, min_layers: int = 1) -> float:
    c = t.config
    m, p, L = c.num_microbatches, c.pp, t.num_layers
    work = L * (t.block.fwd_ns + t.block.bwd_ns) + t.embedding.fwd_ns + t.embedding.bwd_ns + t.head.fwd_ns + t.head.bwd_ns
    if c.virtual_stages == 1:
        pipeline = work / (1 - (1 - 1 / m) ** p) if m > 1 else work
    else:
        pipeline = max(work, m * work / p + (p - 1) / 2 * min_layers * (t.block.fwd_ns + t.block.bwd_ns))
    tails = L * (t.gather_block_ns + t.optim_block_ns) + t.gather_embedding_ns + t.gather_head_ns
    tails += t.optim_embedding_ns + t.optim_head_ns
    return max(pipeline, (m * work + tails) / p)


def states_fit(t: StageTable) -> bool:
    """The busiest rank holds at least the average of the model states (and the process baseline); if that
    alone exceeds capacity, no layout fits."""
    total = t.num_layers * t.block_state_bytes + t.embedding_state_bytes + t.head_state_bytes
    return total / t.config.pp + t.baseline_bytes <= t.capacity_bytes
