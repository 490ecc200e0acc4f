"""From a configuration and its stage layout to the numbers a user reads: step time, throughput, MFU/HFU,
memory per pipeline rank, and where the time and the memory go."""

from __future__ import annotations

import dataclasses

from autoplan.cost.evaluate import Evaluation, StageShape, evaluate, path_of
from autoplan.cost.local_params import local_params_per_rank
from autoplan.cost.stage_table import Config, StageTable, rank_state_bytes
from autoplan.cost.tables import build_table
from autoplan.cost.workload import LayerSplit, Workload, WorkloadFn
from autoplan.schema import (
    Cluster, Layout, MemoryBreakdown, ModelSpec, Predicted, Stage, TimeBreakdown, TrainingSetup,
)
from autoplan.schema.schedule import stage_rank

GIB = 2**30


def config_of(layout: Layout) -> Config:
    return Config(**{f.name: getattr(layout, f.name) for f in dataclasses.fields(Config)})


def split_of(config: Config) -> LayerSplit:
    """The per-layer split of a configuration: what its workload is built for."""
    return LayerSplit(micro_batch_size=config.micro_batch_size, tp=config.tp,
                      sequence_parallel=config.sequence_parallel, cp=config.cp)


def shapes_of(layout: Layout) -> tuple[StageShape, ...]:
    return tuple(StageShape(s.num_layers, len(s.selective_recompute), len(s.full_recompute)) for s in layout.stages)


def stages_from_shapes(shapes: tuple[StageShape, ...], config: Config) -> tuple[Stage, ...]:
    """Concrete layer ranges; within a stage the first layers recompute fully, the next selectively."""
    stages, first = [], 0
    for i, shape in enumerate(shapes):
        full = tuple(range(first, first + shape.full))
        selective = tuple(range(first + shape.full, first + shape.full + shape.selective))
        stages.append(Stage(index=i, rank=stage_rank(config.schedule, i, config.pp),
                            layers=(first, first + shape.layers), full_recompute=full, selective_recompute=selective))
        first += shape.layers
    return tuple(stages)


def layout_of(config: Config, shapes: tuple[StageShape, ...]) -> Layout:
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(Config)}
    return Layout(**fields, stages=stages_from_shapes(shapes, config))


def estimate_layout(workload_fn: WorkloadFn, cluster: Cluster, training: TrainingSetup,
                    layout: Layout) -> tuple[Predicted, Evaluation, StageTable]:
    config = config_of(layout)
    workload = workload_fn(split_of(config))
    table = build_table(workload, cluster, training, config)
    shapes = shapes_of(layout)
    evaluation = evaluate(table, shapes)
    return predict(workload, cluster, training, table, shapes, evaluation), evaluation, table


def predict(workload: Workload, cluster: Cluster, training: TrainingSetup, table: StageTable,
            shapes: tuple[StageShape, ...], evaluation: Evaluation) -> Predicted:
    c = table.config
    step_s = evaluation.step_ns * 1e-9
    n_devices = c.dims.world_size
    microbatches_total = training.global_batch_size // c.micro_batch_size
    w = workload
    # a layer's FLOPs are one device's: the TP shard of the cp-th part of the sequence
    per_microbatch = w.split.dims.world_size * microbatches_total
    model_flops = 3 * (w.num_layers * w.block.fwd_flops + w.head.fwd_flops) * per_microbatch
    sel = sum(s.selective for s in shapes)
    full = sum(s.full for s in shapes)
    recompute_flops = (sel * w.block.selective_extra_flops + full * w.block.fwd_flops) * per_microbatch
    peak = cluster.device.peak_tflops(training.activation_precision) * 1e12  # fp8: MFU against the bf16 peak
    per_gpu = model_flops / step_s / n_devices
    per_gpu_hw = (model_flops + recompute_flops) / step_s / n_devices
    memory_gib = tuple(evaluation.memory[r].total_bytes / GIB for r in sorted(evaluation.memory))
    peak_rank = max(range(c.pp), key=lambda r: memory_gib[r])
    return Predicted(
        step_time_s=step_s,
        tokens_per_s=training.global_batch_size * training.seq_len / step_s,
        tflops_per_gpu=per_gpu / 1e12, mfu=per_gpu / peak,
        hardware_tflops_per_gpu=per_gpu_hw / 1e12, hfu=per_gpu_hw / peak,
        peak_memory_gib=max(memory_gib), memory_gib_per_stage=memory_gib,
        capacity_gib=table.capacity_bytes / GIB,
        time=time_breakdown(workload, table, shapes, evaluation),
        memory=memory_breakdown(workload, training, table, shapes, evaluation, peak_rank, cluster),
    )


def with_local_params(predicted: Predicted, model: ModelSpec, layout: Layout, training: TrainingSetup) -> Predicted:
    """The prediction with the exact per-rank parameter counts a plan file carries (needs the model spec,
    which a measured profile may lack, hence not part of ``predict``)."""
    return dataclasses.replace(predicted, local_params_per_rank=local_params_per_rank(model, layout, training))


def time_breakdown(w: Workload, t: StageTable, shapes: tuple[StageShape, ...], ev: Evaluation) -> TimeBreakdown:
    """Where the critical rank's step goes; ``bubble_s`` is what its busy time and transfers leave idle."""
    r, m = ev.critical_rank, t.config.num_microbatches
    share = t.share  # the host's slow-downs on compute (1 on GPUs; cost/host_model.py)
    compute = recompute = tp_comm = cp_comm = 0.0
    for s in t.stages_of(r):
        n, sh = shapes[s].layers, shapes[s]
        layers = [(w.block, n)] + ([(w.embedding, 1)] if s == 0 else []) + ([(w.head, 1)] if s == t.num_stages - 1 else [])
        for cost, count in layers:
            compute += m * count * share.scaled_s(cost.fwd_s + cost.bwd_s, cost.host_fwd_s + cost.host_bwd_s)
            tp_comm += m * count * (cost.tp_fwd_s + cost.tp_bwd_s)
            cp_comm += m * count * (cost.cp_fwd_s + cost.cp_bwd_s)
        compute += m * (t.action_fwd_ns + t.action_bwd_ns) * 1e-9  # pipeline runtime's host work per action
        recompute += m * (sh.selective * w.block.selective_extra_s * share.pipeline
                       + sh.full * share.scaled_s(w.block.fwd_s, w.block.host_fwd_s)
                       + sh.full * t.full_extra_weight_ns * 1e-9)  # split backwards: the weight half's reruns
        tp_comm += m * sh.full * w.block.tp_fwd_s
        cp_comm += m * sh.full * w.block.cp_fwd_s
    busy = ev.timeline.busy(r) * 1e-9
    zero3 = max(0.0, busy - compute - recompute - tp_comm - cp_comm)
    path = _transfers_on_path(t, ev)
    end_s = ev.rank_end_ns[r] * 1e-9
    pp_comm = min(path, max(0.0, end_s - busy))
    step_s = ev.step_ns * 1e-9
    optimizer = _optimizer_s(t, shapes, r)
    # exposed gradient reduction + ZeRO-1/2 weight all-gather + the runtime's per-step small collectives
    dp_comm = ev.rank_tail_ns[r] * 1e-9 - optimizer
    bubble = step_s - (compute + recompute + tp_comm + cp_comm + zero3 + pp_comm + dp_comm + optimizer)
    return TimeBreakdown(compute_s=compute, recompute_s=recompute, tp_comm_s=tp_comm, pp_comm_s=pp_comm,
                         zero3_gather_s=zero3, bubble_s=max(0.0, bubble), dp_comm_s=dp_comm, optimizer_s=optimizer,
                         cp_comm_s=cp_comm)


def _transfers_on_path(t: StageTable, ev: Evaluation) -> float:
    path = path_of(t, ev)
    return sum(c * t.p2p_ns[e] for e, c in path.transfers.items()) * 1e-9


def _optimizer_s(t: StageTable, shapes: tuple[StageShape, ...], rank: int) -> float:
    stages = t.stages_of(rank)
    ns = sum(shapes[s].layers for s in stages) * t.optim_block_ns
    ns += (t.optim_embedding_ns if 0 in stages else 0) + (t.optim_head_ns if t.num_stages - 1 in stages else 0)
    return ns * 1e-9


def memory_breakdown(w: Workload, training: TrainingSetup, t: StageTable, shapes: tuple[StageShape, ...],
                     ev: Evaluation, rank: int, cluster: Cluster) -> MemoryBreakdown:
    c = t.config
    stages = t.stages_of(rank)
    params = sum(shapes[s].layers for s in stages) * w.block.params
    if 0 in stages:
        params += w.embedding.params
    if t.num_stages - 1 in stages:
        params += w.head.params + (w.tied_copy_params if c.pp > 1 else 0.0)
    per_param = rank_state_bytes(training, c, w.stack)
    mem = ev.memory[rank]
    return MemoryBreakdown(
        weights_gib=params * per_param.weights / GIB, gradients_gib=params * per_param.gradients / GIB,
        optimizer_gib=params * per_param.optimizer / GIB, activations_gib=mem.activations_bytes / GIB,
        buffers_gib=mem.fixed_bytes / GIB, reserve_gib=mem.reserve_bytes / GIB, total_gib=mem.total_bytes / GIB,
        runtime_gib=mem.baseline_bytes / GIB,
        reserved_gib=min(mem.total_bytes * (1 + w.stack.allocator_cache) / GIB, cluster.device.memory_gib),
    )

