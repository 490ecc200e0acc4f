"""From a configuration and its stage layout to the numbers a user reads: step time, throughput, MFU/HFU,
memory per pipeline rank, and where the time and the memory go."""

from __future__ import annotations

import dataclasses

from autoplan.cost.evaluate import Evaluation, RankMemory, StageShape, evaluate, path_of, shape_values, table_shapes
from autoplan.cost.local_params import local_params_per_rank
from autoplan.cost.stage_table import Config, StageTable, rank_state_bytes, whole_grad_bytes
from autoplan.cost.stage_terms import rank_backward_reduce, rank_optimizer
from autoplan.cost.tables import build_table
from autoplan.cost.workload import LayerCost, LayerSplit, Workload, WorkloadFn, with_exposed_exchange
from autoplan.schema import (
    Cluster, Layout, MemoryBreakdown, ModelSpec, Predicted, Stage, StackProfile, TimeBreakdown, TrainingSetup,
)
from autoplan.schema.schedule import stage_rank

GIB = 2**30


def config_of(layout: Layout) -> Config:
    return Config(**{f.name: getattr(layout, f.name) for f in dataclasses.fields(Config)})


def split_of(config: Config) -> LayerSplit:
    """The per-layer split of a configuration: what its workload is built for."""
    return LayerSplit(micro_batch_size=config.micro_batch_size, tp=config.tp,
                      sequence_parallel=config.sequence_parallel, cp=config.cp, ep=config.ep, etp=config.etp)


def shapes_of(layout: Layout) -> tuple[StageShape, ...]:
    return tuple(StageShape(s.num_layers, len(s.selective_recompute), len(s.full_recompute)) for s in layout.stages)


def stages_from_shapes(shapes: tuple[StageShape, ...], config: Config, dense_layers: int = 0) -> tuple[Stage, ...]:
    """Concrete layer ranges; within a stage the first layers recompute fully, the next selectively, past
    ``dense_layers`` leading blocks on stage 0 that recompute not at all (a MoE model's dense blocks when its
    table keeps them, cost/stage_table.py)."""
    stages, first = [], 0
    for i, shape in enumerate(shapes):
        start = first + (dense_layers if i == 0 else 0)
        full = tuple(range(start, start + shape.full))
        selective = tuple(range(start + shape.full, start + shape.full + shape.selective))
        stages.append(Stage(index=i, rank=stage_rank(config.schedule, i, config.pp),
                            layers=(first, first + shape.layers), full_recompute=full, selective_recompute=selective))
        first += shape.layers
    return tuple(stages)


def layout_of(config: Config, shapes: tuple[StageShape, ...], dense_layers: int = 0) -> Layout:
    """The layout of per-stage counts as a plan counts them (every block); ``dense_layers``: a MoE model's
    leading dense blocks when stage 0 holds them without recomputing them (with ``dense_full`` they are the
    first of stage 0's fully recomputed blocks: 0 here)."""
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(Config)}
    return Layout(**fields, stages=stages_from_shapes(shapes, config, dense_layers))


def dense_full_of(layout: Layout, dense_layers: int) -> bool:
    """Whether a layout recomputes a MoE model's leading dense blocks (all fully: True; none: False); any
    other choice for them is refused (the cost model prices those two, cost/stage_table.py)."""
    if not dense_layers:
        return False
    dense = set(range(dense_layers))
    full = dense & set(layout.stages[0].full_recompute)
    other = dense & {i for s in layout.stages for i in s.selective_recompute}
    if other or full not in (set(), dense):
        raise ValueError(f"the model's {dense_layers} leading dense blocks are recomputed fully all together or not "
                         f"at all; stage 0 recomputes {sorted(full | other)} of them")
    return bool(full)


def layout_dense_layers(table: StageTable) -> int:
    """``layout_of``'s ``dense_layers`` for shapes of this table."""
    return 0 if table.dense_full else table.dense_layers


def estimate_layout(workload_fn: WorkloadFn, cluster: Cluster, training: TrainingSetup,
                    layout: Layout) -> tuple[Predicted, Evaluation, StageTable]:
    config = config_of(layout)
    workload = workload_fn(split_of(config))
    table = build_table(workload, cluster, training, config, dense_full_of(layout, workload.dense_layers))
    shapes = shapes_of(layout)
    evaluation = evaluate(table, table_shapes(table, shapes))
    return predict(workload, cluster, training, table, shapes, evaluation), evaluation, table


def predict(workload: Workload, cluster: Cluster, training: TrainingSetup, table: StageTable,
            shapes: tuple[StageShape, ...], evaluation: Evaluation) -> Predicted:
    """``shapes`` as a plan counts them (every block); ``evaluation`` of the table's (evaluate.table_shapes)."""
    c = table.config
    step_s = evaluation.step_ns * 1e-9
    n_devices = c.dims.world_size
    microbatches_total = training.global_batch_size // c.micro_batch_size
    w = workload
    # a layer's FLOPs are one device's: the TP shard of the cp-th part of the sequence
    per_microbatch = w.split.dims.world_size * microbatches_total
    k = w.dense_layers  # a MoE model's leading dense blocks (cost/stage_table.py)
    blocks = (w.num_layers - k) * w.block.fwd_flops + (k * w.dense_block.fwd_flops if k else 0.0)
    model_flops = 3 * (blocks + w.head.fwd_flops) * per_microbatch
    sel = sum(s.selective for s in shapes)
    dense_full = k if table.dense_full else 0  # of stage 0's fully recomputed blocks, the dense ones
    full = sum(s.full for s in shapes) - dense_full
    recompute_flops = (sel * w.block.selective_extra_flops + full * w.block.fwd_flops
                       + (dense_full * w.dense_block.fwd_flops if dense_full else 0.0)) * per_microbatch
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


def stage_layers(w: Workload, t: StageTable, s: int, n: int) -> list[tuple[LayerCost, int]]:
    """(layer cost, count) of stage ``s`` holding ``n`` blocks as a plan counts them: its MoE (or every)
    blocks, stage 0's leading dense blocks and embedding, the last stage's head."""
    k = w.dense_layers if s == 0 else 0
    layers = [(w.block, n - k)] + ([(w.dense_block, k)] if k else [])
    return layers + ([(w.embedding, 1)] if s == 0 else []) + ([(w.head, 1)] if s == t.num_stages - 1 else [])


def time_breakdown(w: Workload, t: StageTable, shapes: tuple[StageShape, ...], ev: Evaluation) -> TimeBreakdown:
    """Where the critical rank's step goes; ``bubble_s`` is what its busy time and transfers leave idle.
    ``shapes`` as a plan counts them (every block)."""
    w = with_exposed_exchange(w, t.config)  # the all-to-all the table put on the critical path
    r, m = ev.critical_rank, t.config.num_microbatches
    share = t.share  # the host's slow-downs on compute (1 on GPUs; cost/host_model.py)
    compute = recompute = tp_comm = cp_comm = ep_comm = 0.0
    for s in t.stages_of(r):
        n, sh = shapes[s].layers, shapes[s]
        for cost, count in stage_layers(w, t, s, n):
            compute += m * count * share.scaled_s(cost.fwd_s + cost.bwd_s, cost.host_fwd_s + cost.host_bwd_s)
            tp_comm += m * count * (cost.tp_fwd_s + cost.tp_bwd_s)
            cp_comm += m * count * (cost.cp_fwd_s + cost.cp_bwd_s)
            ep_comm += m * count * (cost.ep_fwd_s + cost.ep_bwd_s)
        compute += m * (t.action_fwd_ns + t.action_bwd_ns) * 1e-9  # pipeline runtime's host work per action
        dense = w.dense_layers if s == 0 and t.dense_full else 0  # recomputed leading dense blocks
        full = sh.full - dense
        recompute += m * (sh.selective * w.block.selective_extra_s * share.pipeline
                       + full * share.scaled_s(w.block.fwd_s, w.block.host_fwd_s)
                       + full * t.full_extra_weight_ns * 1e-9)  # split backwards: the weight half's reruns
        tp_comm += m * full * w.block.tp_fwd_s
        cp_comm += m * full * w.block.cp_fwd_s
        ep_comm += m * full * w.block.ep_fwd_s  # a recomputed MoE block dispatches and combines again
        if dense:
            d = w.dense_block
            weight_reruns = d.weight_groups * share.scaled_s(d.fwd_s, d.host_fwd_s) if t.split_backward else 0.0
            recompute += m * dense * (share.scaled_s(d.fwd_s, d.host_fwd_s) + weight_reruns)
            tp_comm += m * dense * d.tp_fwd_s
            cp_comm += m * dense * d.cp_fwd_s
            ep_comm += m * dense * d.ep_fwd_s
    values = shape_values(table_shapes(t, shapes))
    reduce = m * rank_backward_reduce(t, r).value(values) * 1e-9
    busy = ev.timeline.busy(r) * 1e-9
    zero3 = max(0.0, busy - compute - recompute - tp_comm - cp_comm - ep_comm - reduce)
    path = _transfers_on_path(t, ev)
    end_s = ev.rank_end_ns[r] * 1e-9
    pp_comm = min(path, max(0.0, end_s - busy))
    step_s = ev.step_ns * 1e-9
    optimizer = rank_optimizer(t, r).value(values) * 1e-9
    # exposed gradient reduction (ZeRO 2/3: in every micro-batch's backward) + ZeRO-1/2 weight all-gather + the
    # runtime's per-step small collectives
    dp_comm = ev.rank_tail_ns[r] * 1e-9 - optimizer + reduce
    bubble = step_s - (compute + recompute + tp_comm + cp_comm + ep_comm + zero3 + pp_comm + dp_comm + optimizer)
    return TimeBreakdown(compute_s=compute, recompute_s=recompute, tp_comm_s=tp_comm, pp_comm_s=pp_comm,
                         zero3_gather_s=zero3, bubble_s=max(0.0, bubble), dp_comm_s=dp_comm, optimizer_s=optimizer,
                         cp_comm_s=cp_comm, ep_comm_s=ep_comm)


def _transfers_on_path(t: StageTable, ev: Evaluation) -> float:
    path = path_of(t, ev)
    return sum(c * t.p2p_ns[e] for e, c in path.transfers.items()) * 1e-9


def reserved_bytes(mem: RankMemory, stack: StackProfile, pp: int) -> float:
    """What the caching allocator holds reserved at the rank's peak when the device has room (what torchtitan
    logs as ``max_memory_reserved``): the allocated peak, its ``allocator_cache`` share, and under pipelining
    ``pipeline_allocator_cache`` of the dynamic memory (activations with the kept outputs, working buffers)."""
    dynamic = mem.activations_bytes + mem.fixed_bytes
    return mem.total_bytes * (1 + stack.allocator_cache) + (stack.pipeline_allocator_cache * dynamic if pp > 1 else 0)


def memory_breakdown(w: Workload, training: TrainingSetup, t: StageTable, shapes: tuple[StageShape, ...],
                     ev: Evaluation, rank: int, cluster: Cluster) -> MemoryBreakdown:
    """The rank's memory by kind; ``shapes`` as a plan counts them. A MoE model's routed-expert states (sharded
    over edp) are ``expert_states_gib``, the other parameters' the weights, gradients and optimizer rows. The
    gradients include the whole gradients of the stages that hold them at the rank's peak (stage_table.py
    ``whole_grads``; evaluate.RankMemory), the experts' among the expert states. The activations include the
    last-stage outputs a stack keeps under pipelining (``RankMemory.kept_outputs_bytes``), which share their
    reserve."""
    c = t.config
    stages = t.stages_of(rank)
    held = [(cost, count) for s in stages for cost, count in stage_layers(w, t, s, shapes[s].layers)]
    params = sum(count * cost.params for cost, count in held)
    experts = sum(count * cost.expert_params for cost, count in held)
    if t.num_stages - 1 in stages and c.pp > 1:  # the last stage's own copy of a tied embedding
        params += w.tied_copy_params
    per_param = rank_state_bytes(training, c, w.stack)
    per_expert = rank_state_bytes(training, c, w.stack, expert=True).total
    params -= experts
    mem = ev.memory[rank]
    live = [(cost, count) for s in mem.whole_grad_stages for cost, count in stage_layers(w, t, s, shapes[s].layers)]
    whole_params = sum(count * cost.params for cost, count in live)
    if t.num_stages - 1 in mem.whole_grad_stages and c.pp > 1:
        whole_params += w.tied_copy_params
    whole_experts = sum(count * cost.expert_params for cost, count in live)
    per_whole = whole_grad_bytes(training, c, w.stack)
    return MemoryBreakdown(
        weights_gib=params * per_param.weights / GIB,
        gradients_gib=(params * per_param.gradients + (whole_params - whole_experts) * per_whole) / GIB,
        optimizer_gib=params * per_param.optimizer / GIB, activations_gib=mem.activations_bytes / GIB,
        buffers_gib=mem.fixed_bytes / GIB, reserve_gib=mem.reserve_bytes / GIB, total_gib=mem.total_bytes / GIB,
        runtime_gib=mem.baseline_bytes / GIB,
        reserved_gib=min(reserved_bytes(mem, w.stack, c.pp) / GIB, cluster.device.memory_gib),
        expert_states_gib=(experts * per_expert + whole_experts * per_whole) / GIB,
    )
