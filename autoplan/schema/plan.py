"""The plan: the contract between the planner (which only writes it) and the runtime (which only reads it).

A plan is self-contained: it embeds the model spec, the cluster (with its device profile) and the training
setup it was made for, so ``autoplan run plan.yaml`` needs nothing else. A plan for a user's own
``nn.Module`` (``ModulePlan``, at the end of this file) names the module's factory instead of a spec; only
``autoplan run`` reads it (runtime/models/adapter.py).

Naming: a *stage* is a contiguous run of transformer layers, one model chunk. With the interleaved
schedule each pipeline *rank* holds ``virtual_stages`` stages: stage ``i`` runs on rank ``i % pp`` (the
looped placement of Narayanan et al. 2021 and of torch's ScheduleInterleaved1F1B), and with the V-shaped
zero-bubble schedules (``zbv``, ``dualpipev``) rank r holds stages r and 2 pp - 1 - r; ``stage_rank`` in
schema/schedule.py decides it. Stage 0 also holds the
embedding, the last stage also holds the final norm and the output projection ("head"). ``layers`` is a
half-open range ``[first, stop)`` of block indices.

Rank order (what the cost model assumes and the runtime builds; ``ParallelDims`` in
schema/parallel_dims.py owns it and every group derived from it): tp fastest, then cp, then dp, then pp:

    global_rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)),   world = tp * cp * dp * pp

(Megatron's formula with the context-parallel axis inside the data-parallel one; torchtitan's mesh
order pp, dp, cp, tp). So a TP group sits inside one node whenever tp divides devices_per_node, a
CP group (stride tp) too when tp * cp does, and the ranks that hold the same parameters -- the dp x cp
ranks of one (pp, tp) coordinate, over which gradients are averaged and ZeRO shards -- are
consecutive at stride tp.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, get_args

from autoplan.errors import SpecError
from autoplan.schema._io import require, require_range
from autoplan.schema.cluster import Cluster
from autoplan.schema.limits import MAX_BATCH_SIZE, MAX_DEVICES, MAX_DEVICES_PER_NODE, MAX_LAYERS
from autoplan.schema.model import ModelSpec
from autoplan.schema.parallel_dims import ParallelDims
from autoplan.schema.schedule import ZERO_BUBBLE, stage_rank
from autoplan.schema.stack import DEFAULT_STACK, StackProfile
from autoplan.schema.training import TrainingSetup, require_runnable_precision

SCHEMA_VERSION = 1
ScheduleKind = Literal["gpipe", "1f1b", "interleaved", "zb1p", "zbv", "dualpipev"]
"""zb1p, zbv and dualpipev split each backward into an input and a weight part (schema/schedule.py)."""
RecomputeMode = Literal["none", "selective", "full"]


@dataclass(frozen=True)
class Stage:
    index: int
    rank: int
    layers: tuple[int, int]
    full_recompute: tuple[int, ...] = ()
    """Blocks that keep only their input and rerun their whole forward during backward."""
    selective_recompute: tuple[int, ...] = ()
    """Blocks that drop only the attention core (scores, softmax, dropout) and recompute it (Korthikanti 2022)."""

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    def recompute_of(self, layer: int) -> RecomputeMode:
        if layer in self.full_recompute:
            return "full"
        return "selective" if layer in self.selective_recompute else "none"


def dimension(help: str, *, flag: str | None = None, choices: tuple | None = None, estimate_needs: bool = False,
              pinnable: bool = True, default: Any = dataclasses.MISSING) -> Any:
    """A parallel dimension of ``ParallelConfig`` and what the command line and the search need to know of it.

    ``help`` is the flag's help text, ``flag`` the option name when it is not the field's name with dashes,
    ``choices`` the allowed values (bool fields become ``--x/--no-x``), ``estimate_needs`` marks the fields
    ``autoplan estimate`` cannot default, and ``pinnable`` is False for a field that follows from the others
    (``Pins``, the plan and estimate flags and ``Layout`` are all derived from these fields: a new dimension
    is one new field here, plus its cost-model terms and its loop in search/space.py). ``default`` lets
    plan files written before a dimension existed load (cp: 1).
    """
    return dataclasses.field(default=default, metadata={"help": help, "flag": flag, "choices": choices,
                                                        "estimate_needs": estimate_needs, "pinnable": pinnable})


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """A layout without its stages: what the search enumerates before it places layers and recomputation.

    The one list of parallel dimensions: ``parallel_dimensions()`` below, ``Pins`` (search/space.py), the
    flags of ``autoplan plan`` and ``autoplan estimate`` (cli/common.py) and ``Layout`` derive from it.
    """

    tp: int = dimension("tensor-parallel size (divides the devices per node and the model's heads)",
                        estimate_needs=True)
    pp: int = dimension("pipeline-parallel ranks", estimate_needs=True)
    dp: int = dimension("data-parallel replicas (default: the devices left over by tp x cp x pp)")
    cp: int = dimension("context-parallel ranks: each sequence is split over cp ranks in 2 x cp load-balanced "
                        "chunks and attention runs as a ring exchanging K/V (needs flash attention, dropout 0 "
                        "and seq_len divisible by 2 x cp)", default=1)
    """Context parallelism (ring attention, torch's context_parallel): the ranks of a CP group hold the
    same parameters and different tokens of every sequence; 1 = off."""
    ep: int = dimension("expert-parallel ranks (Mixture of Experts): the routed experts are split over ep ranks, "
                        "tokens reach theirs by all-to-all (divides the experts and tp x cp x dp)", default=1)
    """Expert parallelism: the expert layers regroup the tp x cp x dp ranks of a pipeline rank as etp x ep x edp
    (schema/parallel_dims.py); 1 for a dense model."""
    etp: int = dimension("expert tensor-parallel ranks: each expert's matrices are split over etp ranks "
                         "(Mixture of Experts; divides the expert width)", default=1)
    sequence_parallel: bool = dimension("split norms and dropout along the sequence within the TP group "
                                        "(Korthikanti et al. 2022; needs tp > 1)")
    zero_stage: int = dimension("0: replicated data parallelism; 1: optimizer state sharded; 2: + gradients; "
                                "3: + parameters (FSDP)", choices=(0, 1, 2, 3), estimate_needs=True)
    """0: replicated DP; 1: optimizer state sharded; 2: + gradients; 3: + parameters (FSDP)."""
    offload_optimizer: bool = dimension("optimizer state and step on the host CPU (needs zero stage >= 1)",
                                        flag="offload")
    """Optimizer state and step on the host CPU (ZeRO-Offload / FSDP CPUOffloadPolicy)."""
    schedule: ScheduleKind = dimension("pipeline schedule", choices=get_args(ScheduleKind), estimate_needs=True)
    virtual_stages: int = dimension("stages per pipeline rank (interleaved, zb1p: 2 or more; zbv, dualpipev: 2; gpipe, 1f1b: 1)")
    """Stages per pipeline rank; 1 for gpipe and 1f1b, at least 2 for interleaved."""
    micro_batch_size: int = dimension("sequences per micro-batch", estimate_needs=True)
    num_microbatches: int = dimension("micro-batches per step per replica: global batch / (dp x micro-batch size)",
                                      pinnable=False)
    """Micro-batches per optimizer step on each data-parallel replica."""

    @property
    def num_stages(self) -> int:
        return self.pp * self.virtual_stages

    def defaults_omitted(self) -> dict[str, Any]:
        """ep and etp are left out of files while 1, so dense plans are written as before (schema/_io.py)."""
        return {"ep": 1, "etp": 1}

    @property
    def ep_overlap_possible(self) -> bool:
        """A stack that overlaps the EP all-to-alls with the paired micro-batch's kernels can on this
        configuration: Megatron-Core's ``overlap_moe_expert_parallel_comm`` needs expert parallelism and, under
        pp > 1, interleaved stages (TransformerConfig.__post_init__; it also refuses full recomputation).
        DualPipe (``dualpipev``) pairs a forward and a backward chunk of two micro-batches on every rank so that
        one's all-to-alls run under the other's compute, which is what it was built for (DeepSeek-V3 report,
        arXiv 2412.19437 sec. 3.2.1); Megatron has no such schedule, and its export refuses dualpipev plans."""
        return self.ep > 1 and (self.pp == 1 or self.schedule in ("interleaved", "dualpipev"))

    @property
    def dims(self) -> ParallelDims:
        """The parallel sizes with their rank order, groups and nodes (schema/parallel_dims.py)."""
        return ParallelDims.of(self)

    @property
    def dp_cp(self) -> int:
        """Ranks holding the same parameters (one pipeline rank, one TP shard): dp x cp (``ParallelDims``)."""
        return self.dims.dp_cp

    @property
    def world_size(self) -> int:
        return self.dims.world_size


def parallel_dimensions() -> tuple[dataclasses.Field, ...]:
    """The fields of ``ParallelConfig``, in order, with their ``dimension`` metadata."""
    return dataclasses.fields(ParallelConfig)


@dataclass(frozen=True, kw_only=True)
class Layout(ParallelConfig):
    """How a model is spread over the devices: the part of a plan that the search chooses."""

    stages: tuple[Stage, ...]

    def validate(self) -> None:
        for name, high in (("tp", MAX_DEVICES_PER_NODE), ("pp", MAX_LAYERS), ("dp", MAX_DEVICES), ("cp", MAX_DEVICES),
                           ("virtual_stages", MAX_LAYERS), ("micro_batch_size", MAX_BATCH_SIZE),
                           ("num_microbatches", MAX_BATCH_SIZE)):
            require_range(self, name, 1, high)
        require(self.world_size <= MAX_DEVICES, "dp",
                f"tp * cp * pp * dp = {self.world_size:,} devices; no cluster has more than {MAX_DEVICES:,}")
        for name in ("ep", "etp"):
            require_range(self, name, 1, MAX_DEVICES)
        fold = self.dims.expert_fold_error()
        require(fold is None, "ep", fold or "")
        require(self.zero_stage in (0, 1, 2, 3), "zero_stage", f"{self.zero_stage} is not 0, 1, 2 or 3")
        require(not (self.sequence_parallel and self.tp == 1), "sequence_parallel",
                "needs tp > 1 (sequence parallel splits the norms across the TP group)")
        require(not (self.offload_optimizer and self.zero_stage == 0), "offload_optimizer",
                "needs zero_stage >= 1 (offload moves the sharded optimizer state to the host)")
        if self.schedule in ("interleaved", "zb1p"):
            least = 2 if self.schedule == "interleaved" else 1
            require(self.virtual_stages >= least, "virtual_stages",
                    f"{self.schedule} needs at least {least} stage{'s' * (least > 1)} per rank")
            require(self.pp >= 2, "pp", f"{self.schedule} needs pp >= 2")
            rounds = max(1, self.num_microbatches // self.pp)
            require(self.num_microbatches % rounds == 0, "num_microbatches",
                    f"{self.schedule} needs a multiple of {rounds} (= max(1, num_microbatches // pp))")
        if self.schedule in ZERO_BUBBLE:
            # FSDP2 (torch 2.13) reduce-scatters a ZeRO-3 block's gradients when the block's backward hook
            # fires, at the end of the input backward, before the weight backward has computed them: the
            # weight gradients would be lost (measured: 4e-3 off the serial loss in 5 steps)
            require(self.zero_stage != 3, "zero_stage",
                    f"{self.schedule} splits each backward and ZeRO-3 (FSDP2) reduces gradients before the weight "
                    "half runs; use zero_stage 0-2, or a 1f1b or interleaved schedule with ZeRO-3")
        if self.schedule in ("zbv", "dualpipev"):
            require(self.virtual_stages == 2, "virtual_stages",
                    f"{self.schedule} places exactly 2 stages per rank in a V; write virtual_stages: 2")
            require(self.pp >= 2, "pp", f"{self.schedule} needs pp >= 2")
            if self.schedule == "dualpipev":
                require(self.num_microbatches >= 2 * self.pp, "num_microbatches",
                        f"dualpipev needs at least 2 x pp = {2 * self.pp} micro-batches")
        if self.schedule in ("gpipe", "1f1b"):
            require(self.virtual_stages == 1, "virtual_stages",
                    f"{self.schedule} runs one stage per rank; use schedule: interleaved for more")
        if self.schedule == "1f1b":
            require(self.num_microbatches >= self.pp, "num_microbatches",
                    f"1f1b needs at least pp={self.pp} micro-batches; raise it or use gpipe")
        require(len(self.stages) == self.num_stages, "stages",
                f"expected pp * virtual_stages = {self.num_stages} stages, got {len(self.stages)}")
        start = 0
        for i, stage in enumerate(self.stages):
            where = f"stages[{i}]"
            require(stage.index == i, f"{where}.index", f"expected {i}")
            owner = stage_rank(self.schedule, i, self.pp)
            require(stage.rank == owner, f"{where}.rank", f"stage {i} runs on rank {owner}")
            first, stop = stage.layers
            require(first == start and stop > first, f"{where}.layers",
                    f"expected a non-empty range starting at layer {start}, got [{first}, {stop})")
            for kind in ("full_recompute", "selective_recompute"):
                ids = getattr(stage, kind)
                require(all(first <= k < stop for k in ids) and len(set(ids)) == len(ids),
                        f"{where}.{kind}", f"layers must be distinct and inside [{first}, {stop})")
            require(not set(stage.full_recompute) & set(stage.selective_recompute), f"{where}",
                    "a layer cannot be both full_recompute and selective_recompute")
            start = stop


def check_fits(layout: Layout, model: ModelSpec, training: TrainingSetup, num_devices: int | None) -> None:
    """The checks that need the model and the world as well as the layout."""
    Layout.validate(layout)  # not a subclass override: Plan.validate calls this function
    heads, kv = model.num_attention_heads, model.num_kv_heads
    require(heads % layout.tp == 0, "tp", f"tp={layout.tp} does not divide num_attention_heads={heads}; "
            f"use a tp that divides {heads}")
    require(kv % layout.tp == 0, "tp", f"tp={layout.tp} does not divide num_kv_heads={kv}; use a tp that divides {kv}")
    require(model.ffn_hidden_size % layout.tp == 0, "tp",
            f"tp={layout.tp} does not divide ffn_hidden_size={model.ffn_hidden_size}")
    last = layout.stages[-1].layers[1] if layout.stages else 0
    require(last == model.num_layers, "stages", f"stages cover {last} layers, the model has {model.num_layers}")
    require(layout.num_stages <= model.num_layers, "pp",
            f"pp * virtual_stages = {layout.num_stages} exceeds num_layers = {model.num_layers}")
    check_context_parallel(layout.cp, model, training)
    check_expert_parallel(layout, model)
    reason = sequence_refusal(model, training)
    require(reason is None, "seq_len", reason or "")
    check_world_and_batch(layout, training, num_devices)


def expert_parallel_refusal(ep: int, etp: int, model: ModelSpec, tp: int = 1,
                            sequence_parallel: bool = False) -> tuple[str, str] | None:
    """(field, why) ``ep`` x ``etp`` cannot split this model's experts (None: they can): a dense model has none
    to split; ep must divide the routed experts (each rank holds E / ep whole experts, as Megatron-Core's
    ``num_local_experts``) and etp the expert width (each expert's column- and row-parallel halves); under
    tp > 1 the tokens entering an MoE layer must be the rank's sequence-parallel slice (Megatron-Core's
    MoELayer.forward raises without sequence_parallel under TP: megatron/core/transformer/moe/moe_layer.py)."""
    if model.moe is None:
        for field, size in (("ep", ep), ("etp", etp)):
            if size > 1:
                return field, f"{field}={size} needs a Mixture-of-Experts model ({model.name} has no experts); use 1"
        return None
    if tp > 1 and not sequence_parallel:
        return "sequence_parallel", ("an MoE model under tp > 1 needs sequence parallelism: each TP rank routes its own "
                                     "slice of the tokens, as Megatron-Core requires; add --sequence-parallel")
    experts, width = model.moe.num_experts, model.moe.expert_ffn_size
    if experts % ep:
        return "ep", f"ep={ep} does not divide the {experts} routed experts; use a divisor of {experts}"
    if width % etp:
        return "etp", f"etp={etp} does not divide the expert width expert_ffn_size={width}; use a divisor of {width}"
    return None


def check_expert_parallel(layout: Layout, model: ModelSpec) -> None:
    refusal = expert_parallel_refusal(layout.ep, layout.etp, model, layout.tp, layout.sequence_parallel)
    if refusal is not None:
        require(False, *refusal)


def check_world_and_batch(layout: Layout, training: TrainingSetup, num_devices: int | None) -> None:
    """The layout fills the cluster (when its size is known) and its micro-batches make the global batch."""
    if num_devices is not None:
        require(layout.world_size == num_devices, "dp",
                f"tp * cp * pp * dp = {layout.world_size} but the cluster has {num_devices} devices")
    per_step = layout.micro_batch_size * layout.num_microbatches * layout.dp
    require(per_step == training.global_batch_size, "num_microbatches",
            f"micro_batch_size * num_microbatches * dp = {per_step}, global_batch_size = {training.global_batch_size}")


def sequence_refusal(model: ModelSpec, training: TrainingSetup) -> str | None:
    """Why the model cannot train on ``training.seq_len`` tokens per sequence (None: it can): gpt's learned
    position table has ``max_positions`` rows."""
    s = training.seq_len
    if model.max_positions is not None and s > model.max_positions:
        return (f"{s} tokens exceed the model's max_positions={model.max_positions} (the rows of its learned "
                f"position table); train with --seq-len {model.max_positions} or less")
    return None


def window_refusal(model: ModelSpec, training: TrainingSetup) -> str | None:
    """Why the runtime cannot train the model on ``training.seq_len`` tokens (None: it can): a sliding
    window (Mistral, GPT-OSS) equals the runtime's full causal attention only while the whole sequence fits
    in it. The planner prices the window at any length (a plan for another stack, ``autoplan export``)."""
    s, window = training.seq_len, model.sliding_window
    if window is not None and s > window:
        return (f"{s} tokens exceed the model's sliding_window={window}, and the runtime's attention is full "
                f"causal (equal to the windowed one only within the window); train with --seq-len {window} or "
                "less")
    return None


def require_runnable(plan: "Plan | ModulePlan") -> None:
    """The one-line refusal ``autoplan run``/``eval`` (and every rank, runtime/validate.py) give for a plan
    the runtime cannot execute as planned: a planner-only precision, a model feature the runtime's reference
    models do not compute (``ModelSpec.runtime_refusal``), a sequence longer than the model's window."""
    require_runnable_precision(plan.training)
    if isinstance(plan, ModulePlan):
        return
    unbuilt = plan.model.runtime_refusal()
    require(unbuilt is None, "model", f"{plan.model.name} has {unbuilt}, which the planner prices and the runtime's "
            "models do not compute; export the plan to a stack that does (autoplan export --to megatron) or plan "
            "a model without them")
    reason = window_refusal(plan.model, plan.training)
    require(reason is None, "seq_len", reason or "")


def context_parallel_refusal(cp: int, model: ModelSpec, training: TrainingSetup) -> str | None:
    """Why ``cp`` cannot run this model and setup (None: it can). What torch's ring attention needs
    (torch/distributed/tensor/experimental/_context_parallel): the load-balanced causal split cuts each
    sequence into 2 x cp chunks (rank r keeps chunks r and 2cp-1-r), and each ring step runs a fused
    kernel that returns its log-sum-exp (flash); attention dropout inside those kernels draws its masks
    per ring step, which no layout-free scheme can make equal to serial, so cp needs dropout 0."""
    if cp == 1:
        return None
    if training.seq_len % (2 * cp):
        return (f"seq_len {training.seq_len} is not divisible by 2 x cp = {2 * cp} (the load-balanced causal "
                f"split cuts every sequence into 2 x cp chunks); use a cp with 2 x cp dividing {training.seq_len}")
    if training.attention != "flash":
        return f"cp={cp} runs ring attention on fused flash kernels; use attention: flash (--attention flash)"
    if model.dropout > 0:
        return (f"cp={cp} needs dropout 0 (the model has {model.dropout}): ring attention's kernels draw "
                "attention-dropout masks per ring step, which cannot equal the serial run's")
    if model.sliding_window is not None and model.sliding_window < training.seq_len:
        return (f"cp={cp} runs full causal ring attention, and the model attends through a window of "
                f"{model.sliding_window} tokens; use cp 1")
    return None


def check_context_parallel(cp: int, model: ModelSpec, training: TrainingSetup) -> None:
    reason = context_parallel_refusal(cp, model, training)
    require(reason is None, "cp", reason or "")


@dataclass(frozen=True)
class TimeBreakdown:
    """Seconds per optimizer step on the slowest pipeline rank; the parts sum to ``step_time_s``."""

    compute_s: float
    """Forward + backward matmuls and element-wise kernels, recomputation excluded."""
    recompute_s: float
    tp_comm_s: float
    pp_comm_s: float
    """Point-to-point activation and gradient transfers on the critical path."""
    zero3_gather_s: float
    """ZeRO-3 parameter all-gathers not hidden behind compute."""
    bubble_s: float
    """Pipeline idle time: step time less everything else on the busiest rank."""
    dp_comm_s: float
    """Gradient reduction (and ZeRO-1/2 parameter all-gather) not hidden behind backward: once per step, or
    under ZeRO 2/3 in every micro-batch's backward (cost/stage_table.py ``reduces_each_microbatch``)."""
    optimizer_s: float
    cp_comm_s: float = 0.0
    """Context parallelism: the ring's K/V (and, in backward, dK/dV) exchange not hidden behind the
    attention kernels."""
    ep_comm_s: float = 0.0
    """Expert parallelism (MoE): the token dispatch and combine all-to-alls not hidden behind compute, forward,
    backward and recomputed forwards (cost/stage_table.py ``layer_times``)."""

    def defaults_omitted(self) -> dict[str, Any]:
        """Terms added later, left out of files at 0 so plans without them are written as before."""
        return {"ep_comm_s": 0.0}


@dataclass(frozen=True)
class MemoryBreakdown:
    """GiB on the pipeline rank with the highest peak."""

    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    buffers_gib: float
    """Embedding/logits work buffers, ZeRO-3 gathered parameters, communication buckets."""
    reserve_gib: float
    """Allocator fragmentation reserve."""
    total_gib: float
    runtime_gib: float = 0.0
    """The training process's own memory besides tensors (a CPU rank's heap of torch and the process group,
    the device's memory_baseline_gib); 0 on GPUs."""
    reserved_gib: float = 0.0
    """What the caching allocator holds at the peak: ``total_gib`` and the cache it keeps where the device
    has room (the stack's ``allocator_cache``, and under pipelining its ``pipeline_allocator_cache`` of the
    dynamic memory), at most the device's memory. Compare with
    ``torch.cuda.max_memory_reserved`` (torchtitan logs it); ``total_gib`` with ``max_memory_allocated``
    plus the reserve. 0 in plans written before the field existed."""
    expert_states_gib: float = 0.0
    """Mixture of Experts: the routed experts' weights, gradients and optimizer state on the rank (sharded by ZeRO
    over the experts' data-parallel group edp, cost/stage_table.py); ``weights_gib``, ``gradients_gib`` and
    ``optimizer_gib`` are then the other parameters' only. 0 for a dense model."""

    def defaults_omitted(self) -> dict[str, Any]:
        """Fields added later, left out of files at 0 so plans without them are written as before."""
        return {"expert_states_gib": 0.0}


@dataclass(frozen=True)
class Predicted:
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    """Model FLOPs (Megatron's count, no recomputation) per second per device, 10^12."""
    mfu: float
    hardware_tflops_per_gpu: float
    """FLOPs actually executed (recomputation counted) per second per device, 10^12."""
    hfu: float
    peak_memory_gib: float
    memory_gib_per_stage: tuple[float, ...]
    """Peak memory of each pipeline rank (all its stages together), in rank order."""
    capacity_gib: float
    """Device memory less the planner's margin: what peak_memory_gib must stay under."""
    time: TimeBreakdown
    memory: MemoryBreakdown
    local_params_per_rank: tuple[int, ...] = ()
    """Parameters one device of each pipeline rank holds, in rank order: its stages' tensors after the TP
    split and, under ZeRO-3, its FSDP shard (each tensor's dim 0 cut into dp x cp chunks of
    ceil(rows / (dp x cp)), the padded size FSDP2 allocates on every rank). Under ZeRO 0-2 every rank holds its TP-local tensors
    whole during the step. A tied embedding under pp > 1 counts on both the first and the last rank (the
    head keeps a copy). Exact, so ``autoplan run --dry-run`` can compare it with what the runtime builds;
    empty in plans written before the field existed."""

    def validate(self) -> None:
        # what the runtime and `show` divide by or compare with; the breakdowns are only printed
        require(self.step_time_s > 0, "step_time_s", "must be positive")
        for name in ("tokens_per_s", "tflops_per_gpu", "mfu", "hardware_tflops_per_gpu", "hfu", "peak_memory_gib",
                     "capacity_gib"):
            require(getattr(self, name) >= 0, name, "must be >= 0")
        require(all(m >= 0 for m in self.memory_gib_per_stage), "memory_gib_per_stage", "must be >= 0")


@dataclass(frozen=True)
class SolverInfo:
    name: Literal["bnb", "bruteforce", "given", "cpsat"]
    """bnb: the branch-and-bound search; bruteforce: exhaustive; given: autoplan estimate; cpsat: the name plan
    files written before the search was renamed carry."""
    status: str
    """OPTIMAL when the plan is proven best under the cost model; FEASIBLE when a time limit cut the proof."""
    objective: float
    """The minimised step time in seconds."""
    wall_s: float
    candidates: int = 0
    """Configurations (tp, pp, dp, zero, schedule, micro-batch, ...) considered before pruning."""

    def validate(self) -> None:
        require(self.wall_s >= 0, "wall_s", "must be >= 0")
        require(self.candidates >= 0, "candidates", "must be >= 0")


@dataclass(frozen=True, kw_only=True)
class Plan(Layout):
    schema_version: int = SCHEMA_VERSION
    model: ModelSpec
    cluster: Cluster
    training: TrainingSetup
    predicted: Predicted | None = None
    solver: SolverInfo | None = None
    padded_vocab_size: int | None = None
    """Rows of the embedding and output projection the runtime builds: ``model.padded_vocab_size(tp)``
    (filled in when not given; a plan that gives another value is refused)."""
    stack: StackProfile | None = None
    """The training stack the prediction is for (``--stack``; profiles/stacks/). ``autoplan run`` runs the
    ``autoplan`` stack and says so when the plan was made for another. None (plans written before the field
    existed) reads as ``autoplan``."""

    def __post_init__(self) -> None:
        if self.padded_vocab_size is None:
            object.__setattr__(self, "padded_vocab_size", self.model.padded_vocab_size(self.tp))

    def validate(self) -> None:
        require(self.schema_version == SCHEMA_VERSION, "schema_version",
                f"this autoplan reads version {SCHEMA_VERSION}; re-plan with this version")
        check_fits(self, self.model, self.training, self.cluster.num_devices)
        expected = self.model.padded_vocab_size(self.tp)
        require(self.padded_vocab_size == expected, "padded_vocab_size",
                f"{self.padded_vocab_size} differs from {expected}, vocab_size={self.model.vocab_size} rounded up "
                f"to a multiple of make_vocab_size_divisible_by x tp; remove the key to recompute it")
        if self.predicted is not None:  # one value per pipeline rank: what show, run and dry-run index by rank
            p = self.predicted
            require(len(p.memory_gib_per_stage) == self.pp, "predicted.memory_gib_per_stage",
                    f"{len(p.memory_gib_per_stage)} values for pp={self.pp} pipeline ranks; re-plan (or delete "
                    "the predicted block)")
            require(len(p.local_params_per_rank) in (0, self.pp), "predicted.local_params_per_rank",
                    f"{len(p.local_params_per_rank)} values for pp={self.pp} pipeline ranks; re-plan (or delete "
                    "the predicted block)")

    def layout(self) -> Layout:
        return Layout(**{f: getattr(self, f) for f in LAYOUT_FIELDS})

    @property
    def stack_name(self) -> str:
        """The name of the stack the plan was priced for (``DEFAULT_STACK`` for plans that record none)."""
        return self.stack.name if self.stack is not None else DEFAULT_STACK


LAYOUT_FIELDS = tuple(f.name for f in dataclasses.fields(Layout))
PLAN_KEY_ORDER = ("schema_version", *LAYOUT_FIELDS, "padded_vocab_size", "predicted", "solver", "model", "cluster",
                  "training", "stack")


@dataclass(frozen=True)
class ModuleRef:
    """A user's own ``nn.Module``, as a plan names it: the factory ``autoplan profile`` was given and what
    the profile counted of the module it built. The runtime imports ``factory``'s module and finds its
    ``autoplan_adapter`` beside it (runtime/models/adapter.py); it refuses to run when the module it builds
    has other counts than these (the factory changed since the profile)."""

    factory: str
    """``package.module:function`` returning ``(module, example_batch)``, importable where the ranks run."""
    name: str
    """The profile's name for the model."""
    total_params: int
    """Parameters of the module the factory builds (the profile's ``total_params``)."""
    num_blocks: int
    """Repeated blocks: the pipeline-stage units (the profile's blocks)."""

    def validate(self) -> None:
        module, _, function = self.factory.partition(":")
        require(bool(module) and function.isidentifier() and all(p.isidentifier() for p in module.split(".")),
                "factory", f"{self.factory!r} is not package.module:function; write the factory autoplan profile "
                "was given")
        require_range(self, "total_params", 1, None)
        require_range(self, "num_blocks", 1, MAX_LAYERS)


MODULE_PLAN_REFUSALS = {
    "cp": "context parallelism splits the sequence axis, and the runtime does not know your module's; use cp: 1",
    "sequence_parallel": "sequence parallelism splits the sequence axis, and the runtime does not know your "
                         "module's; use sequence_parallel: false",
    "selective_recompute": "selective recomputation recomputes the reference models' attention core, which your "
                           "module does not have; use full_recompute for those blocks",
}
"""What a plan for a user's module cannot ask for, and why (one line each)."""


@dataclass(frozen=True, kw_only=True)
class ModulePlan(Layout):
    """A plan for a user's own ``nn.Module`` (``autoplan plan PROFILE -o`` on a profile of
    ``package.module:factory``): the layout, the module reference in place of the model spec, the cluster
    and the training setup. Its stages split the module's blocks (the part before them runs on the first
    stage, the part after them on the last); ``training.seq_len`` is what the planner priced, the module's
    inputs are whatever its adapter makes. Only ``autoplan run`` (``runtime.launch``) reads it: the other
    commands read a ``Plan``, and ``load_plan`` refuses a module plan in one line."""

    schema_version: int = SCHEMA_VERSION
    module: ModuleRef
    cluster: Cluster
    training: TrainingSetup
    predicted: Predicted | None = None
    solver: SolverInfo | None = None
    stack: StackProfile | None = None

    def validate(self) -> None:
        require(self.schema_version == SCHEMA_VERSION, "schema_version",
                f"this autoplan reads version {SCHEMA_VERSION}; re-plan with this version")
        Layout.validate(self)
        require(self.cp == 1, "cp", MODULE_PLAN_REFUSALS["cp"])
        require(not self.sequence_parallel, "sequence_parallel", MODULE_PLAN_REFUSALS["sequence_parallel"])
        for i, stage in enumerate(self.stages):
            require(not stage.selective_recompute, f"stages[{i}].selective_recompute",
                    MODULE_PLAN_REFUSALS["selective_recompute"])
        last = self.stages[-1].layers[1] if self.stages else 0
        require(last == self.module.num_blocks, "stages",
                f"stages cover {last} blocks, the module has {self.module.num_blocks}")
        check_world_and_batch(self, self.training, self.cluster.num_devices)

    def layout(self) -> Layout:
        return Layout(**{f: getattr(self, f) for f in LAYOUT_FIELDS})

    @property
    def stack_name(self) -> str:
        return self.stack.name if self.stack is not None else DEFAULT_STACK


MODULE_PLAN_KEY_ORDER = ("schema_version", *LAYOUT_FIELDS, "predicted", "solver", "module", "cluster", "training",
                         "stack")


MODULE_PLAN_COMMANDS = "autoplan run (or torchrun ... -m runtime.launch) runs it"


def is_module_plan(data: Any) -> bool:
    """Whether a plan document is a ``ModulePlan`` (it names a ``module`` instead of a ``model``)."""
    return isinstance(data, dict) and "module" in data and "model" not in data


def module_plan_refusal(path: Any, command: str) -> str:
    """The one line a command that reads only ``Plan`` files gives for a module plan."""
    return (f"{path}: a plan for your own nn.Module (it has module:, not model:); {MODULE_PLAN_COMMANDS}, "
            f"{command} needs a plan of a shipped model, spec or config.json")


MODULE_RUN_REFUSALS = {
    "data": "the adapter's batch() is the data source",
    "checkpoint_dir": "checkpoints of a user's module are not written yet",
    "init_from": "Hugging Face weights map onto the reference models only",
    "save_hf": "Hugging Face folders are written for the reference models only",
    "eval_data": "validation reads token files of the reference models",
    "trace": "the step tracer names the reference models' phases",
    "timeline": "the phase clock names the reference models' phases",
    "tensorboard": "not wired for a user's module yet",
}
"""``autoplan run`` / ``runtime.launch`` options a plan for a user's module refuses, and why."""


def refuse_module_run_options(args: Any) -> None:
    """One line for the first option (an argparse namespace's) that a module plan cannot take."""
    for name, why in MODULE_RUN_REFUSALS.items():
        if getattr(args, name, None) not in (None, "synthetic"):
            raise SpecError(f"--{name.replace('_', '-')}: not for a plan of your own module ({why}); drop it")
