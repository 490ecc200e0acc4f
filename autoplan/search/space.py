"""The search space: which configurations, stage splits and recomputation choices the planner considers.

Configurations (``Config``): tp divides the devices per node, the attention heads, the KV heads and the FFN
width (the vocabulary is padded to fit); pp any value with tp * pp dividing the devices (dp is the rest);
sequence parallel on/off when tp > 1; ZeRO 0-3 when dp > 1; optimizer offload with ZeRO >= 1 on GPUs; every micro-batch
size dividing the per-replica batch; GPipe, 1F1B (needs m >= pp) and interleaved 1F1B with 2 to
``max_virtual_stages`` stages per rank. Pins (``Pins``) fix any of these.

Stage splits: an even split of the layers, except that the first stage (which holds the embedding and,
under 1F1B, the most micro-batches in flight) and the last stage (which holds the head and the loss) may
each give up to ``max_edge_trim`` layers; the interior stages share the rest evenly, any remainder going
to the later ones (which hold fewer micro-batches in flight). With two stages every split within that
range is possible.

Recomputation: per stage, how many layers recompute fully and how many selectively, with every layer
pinned to one mode by ``--recompute``. The planner takes, for each rank, the cheapest choice (least
added backward time) that fits its memory (search/recompute.py); the brute-force search tries every
per-stage choice instead, and tests check that the optima agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Literal

from autoplan.cost.stage_table import Config
from autoplan.schema import Cluster, ModelSpec, ScheduleKind, TrainingSetup


@dataclass(frozen=True)
class Pins:
    """Values the user fixed on the command line; None means "search it"."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    zero_stage: int | None = None
    schedule: ScheduleKind | None = None
    virtual_stages: int | None = None
    micro_batch_size: int | None = None
    sequence_parallel: bool | None = None
    offload_optimizer: bool | None = None
    recompute: Literal["none", "selective", "full"] | None = None


@dataclass(frozen=True)
class SearchLimits:
    max_virtual_stages: int = 4
    max_edge_trim: int = 2


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def num_layers_of(model) -> int:
    """Blocks of a ModelSpec or of a measured profile (``autoplan profile``)."""
    return model.num_layers if isinstance(model, ModelSpec) else len(model.blocks)


def tp_options(model, cluster: Cluster) -> list[int]:
    if not isinstance(model, ModelSpec):  # a profile: the TP sizes its tracer found every block shards at
        from autoplan.profiler.adapter import allowed_tp_sizes  # torch-free module

        return [t for t in divisors(cluster.devices_per_node) if t in allowed_tp_sizes(model)]
    return [t for t in divisors(cluster.devices_per_node)
            if model.num_attention_heads % t == 0 and model.num_kv_heads % t == 0
            and model.ffn_hidden_size % t == 0]  # the vocabulary is padded to a multiple of tp (ModelSpec)


def configs(model: ModelSpec, cluster: Cluster, training: TrainingSetup, pins: Pins,
            limits: SearchLimits = SearchLimits()) -> Iterator[Config]:
    n, L, gbs = cluster.num_devices, num_layers_of(model), training.global_batch_size
    tps = [pins.tp] if pins.tp is not None else tp_options(model, cluster)
    for tp in tps:
        pps = [pins.pp] if pins.pp is not None else range(1, L + 1)
        for pp in pps:
            if n % (tp * pp) or pp > L:
                continue
            dp = n // (tp * pp)
            if (pins.dp is not None and dp != pins.dp) or gbs % dp:
                continue
            for sp in _bools(pins.sequence_parallel, allowed=tp > 1):
                for zero in _zero_stages(pins.zero_stage, dp):
                    gpu = cluster.device.kind == "gpu"  # on a CPU the host is the device: nothing to offload to
                    for offload in _bools(pins.offload_optimizer, allowed=zero >= 1 and gpu):
                        for mbs in _micro_batches(pins.micro_batch_size, gbs // dp):
                            m = gbs // (dp * mbs)
                            for schedule, v in _schedules(pins, pp, m, L, limits):
                                yield Config(tp, pp, dp, sp, zero, offload, schedule, v, mbs, m)


def _bools(pin: bool | None, allowed: bool) -> list[bool]:
    if pin is not None:
        return [pin]
    return [False, True] if allowed else [False]


def _zero_stages(pin: int | None, dp: int) -> list[int]:
    if pin is not None:
        return [pin]
    return [0, 1, 2, 3] if dp > 1 else [0]  # with dp = 1 every ZeRO stage is stage 0


def _micro_batches(pin: int | None, per_replica: int) -> list[int]:
    if pin is not None:
        return [pin] if per_replica % pin == 0 else []
    return divisors(per_replica)


def _schedules(pins: Pins, pp: int, m: int, layers: int, limits: SearchLimits) -> Iterator[tuple[str, int]]:
    kinds = [pins.schedule] if pins.schedule else (["1f1b"] if pp == 1 else ["gpipe", "1f1b", "interleaved"])
    for kind in kinds:
        if kind == "1f1b" and m < pp:
            continue
        if kind != "interleaved":
            if pins.virtual_stages in (None, 1):
                yield kind, 1
            continue
        if pp < 2 or m % max(1, m // pp):
            continue
        vs = [pins.virtual_stages] if pins.virtual_stages else range(2, limits.max_virtual_stages + 1)
        for v in vs:
            if v >= 2 and pp * v <= layers:
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
