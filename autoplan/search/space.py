"""The search space: which configurations, stage splits and recomputation choices the planner considers.

Configurations (``Config``): tp divides the devices per node, the attention heads, the KV heads and the FFN
width (the vocabulary is padded to fit); cp (context parallelism) any value with tp * cp dividing the devices
and 2 * cp dividing the sequence, for a model spec with flash attention and dropout 0 (plan.py's
``context_parallel_refusal``; a CP group that leaves the node pays the inter-node link, cost/comm.py); pp any
value with tp * cp * pp dividing the devices (dp is the rest); sequence parallel on/off when tp > 1; ZeRO 0-3
when dp * cp > 1 (ZeRO shards over the dp x cp ranks that hold the same parameters); optimizer offload with ZeRO >= 1 on GPUs; every micro-batch
size dividing the per-replica batch that leaves at most ``max_microbatches`` micro-batches; GPipe, 1F1B
(needs m >= pp), interleaved 1F1B with 2 to ``max_virtual_stages`` stages per rank, and the zero-bubble
schedules (``SEARCHED_SCHEDULES``): zb1p with 1 to ``max_virtual_stages``, zbv and dualpipev (m >= 2 pp)
with 2; at most
``max_stage_microbatches`` stage forwards per step (m x stages, which sizes the action lists). Pins
(``Pins``) fix any of these.

Mixture-of-Experts models (a spec with ``moe``) add expert parallelism: ep any divisor of the routed experts
and etp 1 or tp (an expert split like the dense layers; any divisor of the expert width when pinned), with
ep x etp dividing tp x cp x dp (the ranks the expert layers regroup, schema/parallel_dims.py), and sequence
parallelism on whenever tp > 1 (Megatron-Core requires it, schema/plan.py ``expert_parallel_refusal``).
A dense model's space is exactly what it was (ep = etp = 1).

Configurations come in groups (``Group``: tp, cp, pp, dp, sequence parallel, micro-batch size, ep, etp), which fix the
per-layer costs and the batch split; the search bounds a whole group before it looks at its ZeRO stages,
offload and schedules.

Stage splits: an even split of the layers, except that the first stage (which holds the embedding and,
under 1F1B, the most micro-batches in flight) and the last stage (which holds the head and the loss) may
each give up to ``max_edge_trim`` layers; the interior stages share the rest evenly, any remainder going
to the later ones (which hold fewer micro-batches in flight). With two stages every split within that
range is possible.

Recomputation: per stage, how many layers recompute fully and how many selectively, with every layer
pinned to one mode by ``--recompute``. The planner takes, for each rank, the cheapest choice (least
added backward time) that fits its memory (search/recompute.py); the brute-force search tries every
per-stage choice instead, and tests check that the optima agree.

Sizes: ``check_size`` refuses problems beyond ``MAX_*`` below (sizes no cluster has), and nothing here
walks a range as long as a user-given number: divisors come from the prime factorization.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterator

from autoplan.cost.profile_ops import allowed_tp_sizes
from autoplan.cost.stage_table import Config
from autoplan.cost.workload import LayerSplit
from autoplan.errors import SpecError
from autoplan.schema import Cluster, ModelSpec, ParallelDims, StackProfile, TrainingSetup
from autoplan.schema.plan import context_parallel_refusal, expert_parallel_refusal, parallel_dimensions
from autoplan.schema.schedule import ZERO_BUBBLE

# Sizes no cluster or model has; beyond them the planner refuses instead of enumerating. The largest
# training clusters today have about 10^5 devices, the deepest models about 10^2 layers, the largest
# global batches about 10^4 sequences and the longest training contexts about 10^6 tokens.
SEARCHED_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb1p", "zbv", "dualpipev")
"""Every schedule the search considers when none is pinned (pp > 1)."""
MAX_DEVICES = 2**20
MAX_DEVICES_PER_NODE = 2**10
MAX_LAYERS = 2**12
MAX_GLOBAL_BATCH = 2**24
MAX_SEQ_LEN = 2**24


def _make_pins() -> type:
    """One optional field per pinnable parallel dimension of ``ParallelConfig``, plus ``recompute``."""
    fields = [(f.name, f"{f.type} | None", dataclasses.field(default=None))
              for f in parallel_dimensions() if f.metadata["pinnable"]]
    fields.append(("recompute", "RecomputeMode | None", dataclasses.field(default=None)))
    cls = dataclasses.make_dataclass("Pins", fields, frozen=True)
    cls.__module__ = __name__
    cls.__doc__ = ("Values the user fixed on the command line; None means \"search it\". Derived from the "
                   "fields of ParallelConfig (schema/plan.py), plus the recomputation mode of every layer.")
    return cls


Pins = _make_pins()


@dataclass(frozen=True)
class SearchLimits:
    max_virtual_stages: int = 4
    max_edge_trim: int = 2
    max_microbatches: int = 1024
    """Micro-batches per step per replica: beyond a thousand the bubble is gone and only the lists grow."""
    max_stage_microbatches: int = 2**16
    """Micro-batches times stages: the number of forwards in a schedule's action lists."""
    schedules: tuple[str, ...] = SEARCHED_SCHEDULES
    """The schedules searched when none is pinned (pp > 1); benchmarks/zero_bubble_plans.py compares the
    classic three with all six."""
    max_cp: int = 32
    """Context-parallel ranks: twice the 16 Llama 3 used for its 128k-token training stage (Dubey et al.
    2024, section 3.3.2); beyond that a rank's chunks shrink below the kernels' efficient lengths while
    the ring's exchange does not."""
    min_cp_seq_len: int = 16384
    """cp > 1 is searched for sequences of at least this many tokens, or when the cluster has more devices
    than ``global_batch_size x devices_per_node`` (too few sequences to give each node's worth of tp x pp
    one without splitting them); otherwise pin ``--cp`` to plan one. The long-context regime is what
    context parallelism is for (Llama 3 turned it on for its 128k stage, Dubey et al. 2024, section 3.3.2);
    elsewhere tp, pp and recomputation already fit the activations, and the cp loop multiplies the search's
    configurations about eight-fold for a few per cent of step time (benchmarks/plan_speed.py measures
    the search). With too few sequences it pays a lot: llama3-405b on 16,384 GPUs with 1,024 sequences
    gains most of a factor of two from cp 4."""


def stack_limits(stack: StackProfile, pinned: str | None = None, limits: SearchLimits | None = None) -> SearchLimits:
    """``limits`` (default ones) with only the schedules ``stack`` runs (``StackProfile.schedules``); a pinned
    schedule outside them refused in one line."""
    limits = limits or SearchLimits()
    if not stack.schedules:
        return limits
    if pinned is not None and pinned not in stack.schedules:
        raise SpecError(f"--schedule: {pinned} is not a schedule the {stack.name} stack runs; use one of "
                        f"{', '.join(stack.schedules)}, or another --stack")
    return dataclasses.replace(limits, schedules=tuple(s for s in limits.schedules if s in stack.schedules))


def check_size(model, cluster: Cluster, training: TrainingSetup) -> None:
    """Refuse, in one line naming the field, sizes beyond any real cluster, model or batch."""
    checks = [
        ("devices_per_node", cluster.devices_per_node, MAX_DEVICES_PER_NODE,
         "devices per node is more than any machine has", "give a real --devices-per-node"),
        ("num_nodes", cluster.num_devices, MAX_DEVICES,
         f"devices ({cluster.num_nodes:,} nodes x {cluster.devices_per_node}) is more than any cluster has",
         "give a real --nodes"),
        ("num_layers", num_layers_of(model), MAX_LAYERS, "layers is more than any model has",
         "fix the model file"),
        ("global_batch_size", training.global_batch_size, MAX_GLOBAL_BATCH,
         "sequences per step is more than any training run uses", "give a real --global-batch-size"),
        ("seq_len", training.seq_len, MAX_SEQ_LEN, "tokens per sequence is more than any model is trained on",
         "give a real --seq-len"),
    ]
    for field, value, limit, what, fix in checks:
        if value > limit:
            raise SpecError(f"{field}: {value:,} {what} (the planner searches at most {limit:,}); {fix}")


def prime_factors(n: int) -> dict[int, int]:
    """Trial division up to sqrt(n), shrinking n as factors come out: sqrt(MAX_GLOBAL_BATCH) steps at most."""
    factors: dict[int, int] = {}
    d = 2
    while d * d <= n:
        while n % d == 0:
            factors[d] = factors.get(d, 0) + 1
            n //= d
        d += 1 if d == 2 else 2
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors


def divisors(n: int) -> list[int]:
    """All divisors of n, ascending, from its prime factorization."""
    result = [1]
    for p, k in prime_factors(n).items():
        result = [d * p**e for d in result for e in range(k + 1)]
    return sorted(result)


def num_layers_of(model) -> int:
    """Blocks of a ModelSpec or of a measured profile (``autoplan profile``)."""
    return model.num_layers if isinstance(model, ModelSpec) else len(model.blocks)


def tp_options(model, cluster: Cluster) -> list[int]:
    if not isinstance(model, ModelSpec):  # a profile: the TP sizes its tracer found every block shards at
        return [t for t in divisors(cluster.devices_per_node) if t in allowed_tp_sizes(model)]
    return [t for t in divisors(cluster.devices_per_node)
            if model.num_attention_heads % t == 0 and model.num_kv_heads % t == 0
            and model.ffn_hidden_size % t == 0]  # the vocabulary is padded to a multiple of tp (ModelSpec)


def cp_options(model, training: TrainingSetup, devices_left: int, max_cp: int = SearchLimits.max_cp,
               min_seq_len: int = SearchLimits.min_cp_seq_len, few_sequences: bool = False) -> list[int]:
    """Context-parallel sizes the search tries: powers of two up to ``max_cp`` dividing ``devices_left``
    (the devices tp leaves) that the model and setup allow (2 x cp divides seq_len, flash, no dropout),
    for sequences of at least ``min_seq_len`` tokens or ``few_sequences`` (SearchLimits.min_cp_seq_len).
    Powers of two as torchtitan and Megatron-LM use (a ring of 3 or 6 splits no real sequence length
    better than its neighbours), which keeps the loop to a handful. 1 only for a profile (its ring's
    K/V width is not recorded, profiler/adapter.py)."""
    if not isinstance(model, ModelSpec) or (training.seq_len < min_seq_len and not few_sequences):
        return [1]
    powers = [2**k for k in range(max_cp.bit_length()) if 2**k <= max_cp and devices_left % 2**k == 0]
    return [c for c in powers if context_parallel_refusal(c, model, training) is None]


@dataclass(frozen=True)
class Group:
    """tp, cp, pp, dp, sequence parallel and micro-batching: what fixes the per-layer costs and the batch split."""

    tp: int
    pp: int
    dp: int
    sequence_parallel: bool
    micro_batch_size: int
    num_microbatches: int
    cp: int = 1
    ep: int = 1
    etp: int = 1

    @property
    def dims(self) -> ParallelDims:
        return ParallelDims(pp=self.pp, dp=self.dp, cp=self.cp, tp=self.tp, ep=self.ep, etp=self.etp)

    @property
    def edp(self) -> int:
        """Ranks holding the same experts (ParallelDims.edp)."""
        return self.dims.edp

    @property
    def dp_cp(self) -> int:
        """The ranks holding the same parameters (gradients reduced and ZeRO sharded over them)."""
        return self.dims.dp_cp

    @property
    def split(self) -> LayerSplit:
        """What fixes the per-layer costs (the group's workload)."""
        return LayerSplit(micro_batch_size=self.micro_batch_size, tp=self.tp,
                          sequence_parallel=self.sequence_parallel, cp=self.cp, ep=self.ep, etp=self.etp)


def is_moe(model) -> bool:
    """A model spec with routed experts (a profile has none the planner knows of)."""
    return isinstance(model, ModelSpec) and model.moe is not None


def expert_options(model, tp: int, cp: int, dp: int, sequence_parallel: bool, pins: Pins) -> list[tuple[int, int]]:
    """(ep, etp) pairs of one (tp, cp, dp, sp): (1, 1) for a dense model; for a MoE model every ep dividing
    the experts and etp 1 or tp (``pins`` fix either) that pass the layout's checks: ep x etp folds into
    tp x cp x dp (``ParallelDims.expert_fold_error``) and the model's (schema/plan.py ``expert_parallel_refusal``)."""
    if not is_moe(model):
        return [(1, 1)]
    eps = [pins.ep] if pins.ep is not None else divisors(model.moe.num_experts)
    etps = [pins.etp] if pins.etp is not None else sorted({1, tp})
    return [(ep, etp) for etp in etps for ep in eps
            if ParallelDims(tp=tp, cp=cp, dp=dp, ep=ep, etp=etp).expert_fold_error() is None
            and expert_parallel_refusal(ep, etp, model, tp, sequence_parallel) is None]


def check_expert_pins(model, pins: Pins) -> None:
    """--ep / --etp above 1 on a model without experts: refused in one line (nothing to split)."""
    if not is_moe(model):
        for name in ("ep", "etp"):
            value = getattr(pins, name)
            if value is not None and value > 1:
                raise SpecError(f"--{name} {value}: {getattr(model, 'name', 'the model')} has no routed experts "
                                f"to split; leave --{name} out")


def groups(model, cluster: Cluster, training: TrainingSetup, pins: Pins,
           limits: SearchLimits = SearchLimits()) -> Iterator[Group]:
    check_expert_pins(model, pins)
    n, L, gbs = cluster.num_devices, num_layers_of(model), training.global_batch_size
    moe = is_moe(model)
    tps = [pins.tp] if pins.tp is not None else tp_options(model, cluster)
    for tp in tps:
        if n % tp:
            continue
        cps = [pins.cp] if pins.cp is not None else cp_options(
            model, training, n // tp, limits.max_cp, limits.min_cp_seq_len,
            few_sequences=n > training.global_batch_size * cluster.devices_per_node)
        for cp in cps:
            if n % (tp * cp):
                continue
            pps = [pins.pp] if pins.pp is not None else divisors(n // (tp * cp))
            for pp in pps:
                dims = ParallelDims.filling(n, pp=pp, cp=cp, tp=tp)
                if dims is None or pp > L:
                    continue
                dp = dims.dp
                if (pins.dp is not None and dp != pins.dp) or gbs % dp:
                    continue
                per_replica = gbs // dp
                for sp in _bools(pins.sequence_parallel, allowed=tp > 1):
                    if moe and tp > 1 and not sp:  # MoE layers under TP route the sequence-parallel slice
                        continue
                    experts = expert_options(model, tp, cp, dp, sp, pins)
                    for mbs in _micro_batches(pins.micro_batch_size, per_replica, limits.max_microbatches):
                        for ep, etp in experts:
                            yield Group(tp, pp, dp, sp, mbs, per_replica // mbs, cp, ep, etp)


def group_choices(group: Group, cluster: Cluster, pins: Pins, num_layers: int,
                  limits: SearchLimits = SearchLimits()) -> tuple[list[tuple[int, bool]], list[tuple[str, int]]]:
    """The group's (ZeRO stage, offload) pairs and (schedule, virtual stages) pairs: its configurations
    are every combination of one of each."""
    # on a CPU the host is the device: nothing to gain by offloading, so it is searched on GPUs only; a
    # pinned offload on a CPU cluster is kept (it runs FSDP2's CPU-offload path, as the runtime tests do)
    gpu = cluster.device.kind == "gpu" or pins.offload_optimizer is True
    states = [(zero, offload) for zero in _zero_stages(pins.zero_stage, group.dp_cp)
              for offload in _bools(pins.offload_optimizer, allowed=zero >= 1 and gpu)]
    return states, list(_schedules(pins, group.pp, group.num_microbatches, num_layers, limits))


def group_configs(group: Group, cluster: Cluster, pins: Pins, num_layers: int,
                  limits: SearchLimits = SearchLimits()) -> Iterator[Config]:
    g = group
    states, schedules = group_choices(group, cluster, pins, num_layers, limits)
    for zero, offload in states:
        for schedule, v in schedules:
            if zero == 3 and schedule in ZERO_BUBBLE:  # refused by the plan (schema/plan.py)
                continue
            yield Config(tp=g.tp, pp=g.pp, dp=g.dp, cp=g.cp, ep=g.ep, etp=g.etp, sequence_parallel=g.sequence_parallel,
                         zero_stage=zero,
                         offload_optimizer=offload, schedule=schedule, virtual_stages=v,
                         micro_batch_size=g.micro_batch_size, num_microbatches=g.num_microbatches)


def configs(model, cluster: Cluster, training: TrainingSetup, pins: Pins,
            limits: SearchLimits = SearchLimits()) -> Iterator[Config]:
    L = num_layers_of(model)
    for group in groups(model, cluster, training, pins, limits):
        yield from group_configs(group, cluster, pins, L, limits)


def _bools(pin: bool | None, allowed: bool) -> list[bool]:
    """The values a boolean dimension takes: True only where it is ``allowed`` (sequence parallelism needs
    tp > 1, offload needs ZeRO >= 1), also when pinned: a pinned True leaves the configurations
    where it cannot apply out instead of writing it into them."""
    if pin is not None:
        return [pin] if allowed or not pin else []
    return [False, True] if allowed else [False]


def _zero_stages(pin: int | None, dp_cp: int) -> list[int]:
    if pin is not None:
        return [pin]
    return [0, 1, 2, 3] if dp_cp > 1 else [0]  # with dp x cp = 1 every ZeRO stage is stage 0


def _micro_batches(pin: int | None, per_replica: int, max_microbatches: int) -> list[int]:
    if pin is not None:
        return [pin] if per_replica % pin == 0 and per_replica // pin <= max_microbatches else []
    return [b for b in divisors(per_replica) if per_replica // b <= max_microbatches]


def _schedules(pins: Pins, pp: int, m: int, layers: int, limits: SearchLimits) -> Iterator[tuple[str, int]]:
    kinds = [pins.schedule] if pins.schedule else (["1f1b"] if pp == 1 else list(limits.schedules))
    for kind in kinds:
        if kind == "1f1b" and m < pp:
            continue
        if kind in ("gpipe", "1f1b"):
            if pins.virtual_stages in (None, 1) and m * pp <= limits.max_stage_microbatches:
                yield kind, 1
            continue
        if pp < 2 or (kind == "dualpipev" and m < 2 * pp):
            continue
        if kind in ("zbv", "dualpipev"):
            vs = [2]
        elif m % max(1, m // pp):
            continue
        else:  # interleaved from 2 stages per rank, zb1p from 1 (ZB-H1)
            least = 2 if kind == "interleaved" else 1
            vs = range(least, limits.max_virtual_stages + 1)
        if pins.virtual_stages:
            vs = [v for v in vs if v == pins.virtual_stages]
        for v in vs:
            if pp * v <= layers and m * pp * v <= limits.max_stage_microbatches:
                yield kind, v


def stage_splits(num_layers: int, num_stages: int, max_edge_trim: int) -> list[tuple[int, ...]]:
    """Layer counts per stage in the family described in the module docstring."""
    if num_stages == 1:
        return [(num_layers,)]
    even = -(-num_layers // num_stages)  # the largest share of an even split
    splits = []
    for trim_first in range(max_edge_trim + 1):
        for trim_last in range(max_edge_trim + 1):
            first, last = even - trim_first, even - trim_last
            rest = num_layers - first - last
            interior = num_stages - 2
            if first < 1 or last < 1 or rest < interior or (interior == 0 and rest != 0):
                continue
            if interior:
                share, extra = divmod(rest, interior)
                middle = tuple([share] * (interior - extra) + [share + 1] * extra)
                if share < 1:
                    continue
            else:
                middle = ()
            split = (first, *middle, last)
            if split not in splits:
                splits.append(split)
    if num_stages == 2:  # two stages: every split with the first stage within the trim range of half
        half = num_layers // 2
        for first in range(max(1, half - max_edge_trim), min(num_layers - 1, half + max_edge_trim) + 1):
            if (first, num_layers - first) not in splits:
                splits.append((first, num_layers - first))
    return splits


def dense_layers_of(model) -> int:
    """A MoE model's leading dense blocks (``MoESpec.first_dense_layers``), which stage 0 holds; else 0."""
    return model.moe.first_dense_layers if is_moe(model) else 0


def table_splits(num_layers: int, num_stages: int, max_edge_trim: int, dense_layers: int = 0) -> list[tuple[int, ...]]:
    """The splits of ``stage_splits`` in the cost table's layout variables: with ``dense_layers`` leading
    dense blocks (MoE models), those splits whose stage 0 holds all of them, stage 0 counting only its MoE
    blocks (cost/stage_table.py). Where no split of the family gives stage 0 that many (more stages than
    the even share allows), stage 0 holds the dense blocks alone and the other stages split the rest as
    ``stage_splits`` does. Without dense blocks: ``stage_splits`` itself."""
    splits = stage_splits(num_layers, num_stages, max_edge_trim)
    if not dense_layers:
        return splits
    kept = [(split[0] - dense_layers, *split[1:]) for split in splits if split[0] >= dense_layers]
    if kept or num_stages == 1:
        return kept
    rest = num_layers - dense_layers
    if rest < num_stages - 1:
        return []
    return [(0, *split) for split in stage_splits(rest, num_stages - 1, max_edge_trim)]
