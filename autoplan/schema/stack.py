"""A training stack: how the software that runs a plan turns a layer into kernels, what it overlaps, and what
memory it holds beyond the model's tensors.

The same layout costs different time and memory on different stacks. Megatron-LM with Transformer Engine
runs a block's memory-bound work as a few fused kernels, eager PyTorch (this project's runtime, torchtitan
without compile) as one kernel per op. Megatron fuses q, k and v into one column-parallel GEMM and
all-reduces the input gradient once per column -> row pair; DTensor tensor parallelism over separate q, k,
v modules does it once per module. torchtitan's selective checkpointing recomputes every other matmul,
Megatron's only the attention core. torch's pipeline runtime keeps an FSDP stage's parameters gathered
for the whole step. A stack profile names these choices, each field with its source (a path in that
project's code, or a kernel measurement), and the cost model reads them instead of guessing.

A stack may carry a few parameters fitted to published runs of that stack, never finer than the stack:
``fitted`` lists each with the runs it came from (benchmarks/stack_runs.py fits them and prints the
leave-one-out error of each).

Shipped stacks (``profiles/stacks/``): ``autoplan`` (this runtime: eager PyTorch, DTensor TP, FSDP2 with
a mixed-precision policy, torch pipelining; the default), ``torchtitan`` (eager), ``torchtitan-compile``
(torch.compile per block), ``torchtitan-compile-async-tp``, ``megatron`` (Megatron-Core with Transformer
Engine and the distributed optimizer, as NeMo runs it), ``megatron-deepep`` (the same with the flex token
dispatcher over DeepEP / HybridEP, module-level recomputation and fp8 saved GEMM inputs), ``hai-llm``
(DeepSeek's framework as the DeepSeek-V3 report describes it) and ``megatron-lm`` (Megatron-LM 2021-22, the dev
set's papers).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from autoplan.schema._io import require, require_range
from autoplan.schema.hardware import FieldSource

DEFAULT_STACK = "autoplan"
"""The stack a plan is priced for unless it names another: the runtime that runs it (``autoplan run``)."""


@dataclass(frozen=True)
class FittedParameter:
    """A field of the profile whose value was fitted to published runs of the stack (and only those)."""

    field: str
    runs: tuple[str, ...]
    """The runs it was fitted to (names in benchmarks/data/stack_runs.yaml, or dev_runs.yaml for the dev set)."""
    method: str = ""
    """How: what was minimised over which runs."""


@dataclass(frozen=True)
class StackProfile:
    name: str
    source: str = ""
    elementwise: Literal["fused", "eager"] = "fused"
    """How the memory-bound work between the GEMMs runs. ``fused``: the bytes of the fused kernels
    (cost/analytic_ops.py's block count: a norm reads and writes the hidden state once, and so on), the
    backward ``BACKWARD_MEMORY_FACTOR`` times that. ``eager``: every torch op its own kernel, each reading
    its inputs and writing its output (``EAGER_ELEMENTS``, counted on the runtime's layers); 2-5 x more
    bytes (RMSNorm alone is six kernels forward)."""
    tp_input_grad_reduce: Literal["per_pair", "per_module"] = "per_pair"
    """Backward all-reduces of tensor parallelism without sequence parallelism. ``per_pair``: one per
    column -> row parallel pair (Megatron's fused QKV and fc1 / gate-up GEMMs): 2 per block.
    ``per_module``: one per column-parallel module, as DTensor's ``ColwiseParallel`` reduces its input
    gradient at each module boundary: q, k, v and the MLP's input matrices, 4 (gpt) or 5 (llama) per block."""
    selective_recompute: Literal["attention_core", "every_other_matmul", "modules"] = "attention_core"
    """What ``recompute: selective`` drops and reruns. ``attention_core``: the scores, softmax and dropout
    (Korthikanti et al. 2022; nothing under flash attention). ``every_other_matmul``: torchtitan's op-level
    selective checkpointing, which keeps the outputs of the odd matmuls of a block and of the attention
    kernel and reruns everything else (the even matmuls and every memory-bound op). ``modules``: Megatron-Core's
    module-level recomputation (``--recompute-granularity selective --recompute-modules ...``) of the modules
    ``recompute_modules`` names: each drops what it names from a block's saved activations and reruns its
    forward in the block's backward (cost/layer_ops.py ``SavedTensor``, ``ModuleRerun``)."""
    recompute_modules: tuple[Literal["core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "moe",
                                     "shared_experts"], ...] = ()
    """With ``selective_recompute: modules``: Megatron-Core's ``recompute_modules`` (transformer_config.py):
    ``core_attn`` the attention kernel, ``layernorm`` the two block norms' outputs, ``moe_act`` the routed
    experts' SwiGLU output, ``mla_up_proj`` MLA's up-projections and RoPE (q, k, v), ``mlp`` a dense block's
    MLP, ``moe`` the whole MoE layer, ``shared_experts`` its shared experts. A module a block lacks does nothing."""
    ep_dispatcher: Literal["alltoall", "deduplicated"] = "alltoall"
    """How an MoE layer exchanges its routed tokens over EP. ``alltoall``: NCCL all-to-alls of every routed copy
    (Megatron-Core's ``MoEAlltoAllTokenDispatcher``: T k rows a rank, cost/moe_ops.py). ``deduplicated``: a token
    crosses the network once per destination node and NVLink once per destination rank (DeepEP's normal kernels,
    HybridEP: Megatron-Core's ``MoEFlexTokenDispatcher``; cost/comm.py ``routed_copies``,
    ``hierarchical_exchange_s``)."""
    ep_dispatch_dtype: Literal["compute", "fp8"] = "compute"
    """Under fp8 training, the dtype the routed tokens travel in towards the experts (the forward dispatch and
    the backward's gradient of the combine); the other direction stays in the activation dtype. ``fp8``:
    DeepSeek-V3's fp8 dispatch (arXiv 2412.19437 sec. 3.3.3), 1 byte an element and a 4-byte scale per 128."""
    fp8_saved: tuple[Literal["gemm_inputs", "attention_output", "swiglu_inputs"], ...] = ()
    """Under fp8 training, which saved activations are kept in fp8 (1 byte) rather than the activation dtype
    (cost/layer_ops.py ``SavedTensor``). ``gemm_inputs``: each fp8 GEMM keeps its own quantized copy of its
    input for its weight gradient (Transformer Engine's default: Megatron-Core transformer_engine.py
    ``set_save_original_input``); ``attention_output``: the attention output, shared by the attention
    kernel's backward and the output projection, in one fp8 copy; ``swiglu_inputs``: the SwiGLU's input
    (DeepSeek-V3 sec. 3.3.3). Empty: every activation in the activation dtype."""
    tp_comm_overlap: float = 0.0
    """Share of the tensor-parallel collectives that runs beside the GEMMs they feed or follow, decomposed
    into chunks (torch's async TP: ``fused_all_gather_matmul``, ``fused_matmul_reduce_scatter``; Transformer
    Engine's user-buffer overlap); hidden up to the GEMMs' own time. 0: each waits for its collective."""
    ep_comm_overlap: float = 0.0
    """Mixture of Experts: share of the expert-parallel all-to-alls that runs beside another micro-batch's
    compute (Megatron-Core's ``overlap_moe_expert_parallel_comm``: in the 1F1B steady state one micro-batch's
    dispatch and combine overlap the paired micro-batch's forward or backward kernels, DualPipe likewise);
    hidden up to the other direction's kernel time (cost/layer_ops.py ``layer_cost``). 0: each waits."""
    schedules: tuple[Literal["gpipe", "1f1b", "interleaved", "zb1p", "zbv", "dualpipev"], ...] = ()
    """The pipeline schedules the stack can run: ``autoplan plan`` searches only these, and refuses a pinned
    ``--schedule`` outside them in one line (Megatron-Core runs 1F1B and its interleaved form only:
    pipeline_parallel/schedules.py ``get_forward_backward_func``). Empty: every schedule the planner knows."""
    weight_backward_reruns: bool = True
    """Under a schedule that splits backwards (zero bubble), a fully recomputed block reruns its forward once
    per weight group in the weight backward: torch 2.13's ``stage_backward_weight`` (pipelining/_backward.py)
    runs one autograd pass per group of parameter-consuming operations (``LayerCost.weight_groups``). False: the
    stack's split backward reuses the input backward's recomputation (DualPipe, Megatron's
    ``delay_wgrad_compute``)."""
    param_gather: Literal["compute", "fp32", "fp8"] = "compute"
    """The dtype ZeRO gathers parameters in: the compute dtype (a mixed-precision policy, Megatron's
    distributed optimizer), fp32 (FSDP2 without a mixed-precision policy), or fp8 under fp8 training
    (torchtitan's ``enable_fsdp_float8_all_gather``)."""
    grad_reduce: Literal["compute", "fp32"] = "fp32"
    """The dtype gradients are reduced (and, unsharded, accumulated) in: fp32 (FSDP2's ``reduce_dtype``,
    Megatron's ``grad_reduce_in_fp32``) or the compute dtype."""
    pipeline_reduces_once: bool = False
    """ZeRO 2/3 under pipelining as torch's schedule runtime runs it: a stage's gradients accumulate whole
    over the micro-batches and are reduce-scattered once, after the stage's last backward, which nothing
    overlaps (stage.py ``backward_maybe_with_nosync``, schedules.py REDUCE_GRAD)."""
    pipeline_keeps_params_gathered: bool = False
    """ZeRO-3 under pipelining: a stage's parameters are gathered once for the step and kept (torchtitan's
    ``reshard_after_forward=False`` under PP); False: gathered again for every forward and backward."""
    pipeline_keeps_outputs: bool = False
    """Under pipelining the last stage keeps every micro-batch's output (the logits, in the activation dtype,
    vocabulary-sharded under TP's loss parallelism) from its forward to the end of the step: torch's schedule
    runtime with ``step(..., return_outputs=True)``, its default (stage.py ``forward_one_chunk`` appends to
    ``output_chunks``, freed by the next step's ``clear_runtime_states``). False: the outputs are freed after
    the loss (``return_outputs=False``; Megatron's schedules compute the loss in the forward step and free the
    output, ``deallocate_output_tensor``)."""
    optimizer_bytes_per_param: float = 0.0
    """Bytes per parameter the optimizer step's kernels move beyond the fused step's
    (cost/model_states.py ``optimizer_step_bytes``): a ``foreach`` AdamW runs its update as several
    multi-tensor passes over the states. 0: a fused step."""
    allocator_reserve: float = 0.05
    """Memory a plan must leave free for the caching allocator's fragmentation, as a share of the activations
    and working buffers: counted against the device's capacity. Small: under pressure the allocator frees
    its cached blocks and retries before it fails (CUDACachingAllocator ``release_cached_blocks``)."""
    allocator_cache: float = 0.0
    """What the caching allocator keeps reserved beyond the allocated peak when the device has room, as a
    share of that peak: the gap between ``max_memory_reserved`` (what torchtitan logs, what nvidia-smi
    shows) and ``max_memory_allocated``. Reported (``MemoryBreakdown.reserved_gib``), never counted against
    the capacity, since the allocator gives it back before failing."""
    pipeline_allocator_cache: float = 0.0
    """Under pipelining (pp > 1), what the caching allocator keeps reserved in addition, as a share of the
    rank's dynamic memory at its peak (activations, kept outputs, working buffers): with several
    micro-batches' activations in flight, freed in another order than they were allocated (the warm-up's
    forwards, then one backward per forward), their blocks fragment the allocator's segments where one
    micro-batch's activations are freed last-in first-out. Fitted to the pipelined runs only; reported like
    ``allocator_cache``, never counted against the capacity."""
    tp_gather: Literal["compute", "fp8"] = "compute"
    """The dtype sequence parallelism all-gathers activations in before a column-parallel linear: the
    activation dtype, or fp8 under fp8 training (torchao's Float8ColwiseParallel casts before gathering)."""
    gemm_efficiency: float = 1.0
    """Share of the device's measured GEMM speed (its kernel-level curve) the stack's matmuls reach inside a
    training step: what a step adds around one GEMM measured alone (launch gaps, a power-capped clock under
    sustained load, collectives' kernels beside them). 1: the kernel-level curve. GPUs only: a CPU's
    calibration (cost/cpu_host/) measures whole steps on the host itself."""
    attention_efficiency: float = 1.0
    """The same for the attention kernel."""
    loss_logit_copies: int = 3
    """fp32 buffers of the logits' size alive at once at the loss's peak, the log-softmax (or softmax) kept
    for backward among them, with the logits whole on each rank (tp = 1). torch's ``F.cross_entropy(logits
    .float())`` (torchtitan's loss, this runtime's): 3, in its backward the kept log-softmax, nll_loss's
    gradient and log-softmax's; Megatron's vocab-parallel cross-entropy: 1, it works in place on its fp32
    copy. The peak is the larger of these and one fp32 buffer beside the e-byte logits or their gradient
    (the casts): cost/activations.py ``logits_transient_bytes``."""
    loss_parallel_logit_copies: int = 4
    """The same under tensor parallelism, each rank holding its vocabulary shard's logits: torch's
    ``loss_parallel`` (torch/distributed/tensor/parallel/loss.py) 4, its backward
    ``_nll_loss_and_log_softmax_backward`` computing ``(zeros + exp(x)) * grad`` beside the kept
    log-softmax; Megatron 1."""
    attention_repeats_kv: bool = False
    """Grouped-query attention: K and V are repeated to every query head before the attention kernel
    (torchtitan's ``repeat_kv``) rather than passed grouped (SDPA's ``enable_gqa``, flash-attn's GQA). The
    kernel then keeps the repeated K and V for backward, and context parallelism's ring gathers, holds and
    returns gradients for them at that width: heads / kv_heads x the grouped bytes
    (cost/spec_workload.py ``stack_attention``)."""
    fitted: tuple[FittedParameter, ...] = ()
    """The fields fitted to published runs of this stack, with the runs."""
    sources: tuple[FieldSource, ...] = ()
    """Where each other field's value comes from."""

    def validate(self) -> None:
        require(0 < len(self.name) <= 200, "name", "must be 1 to 200 characters")
        require_range(self, "tp_comm_overlap", 0.0, 1.0)
        require_range(self, "ep_comm_overlap", 0.0, 1.0)
        require_range(self, "allocator_reserve", 0.0, 10.0)
        require_range(self, "allocator_cache", 0.0, 10.0)
        require_range(self, "pipeline_allocator_cache", 0.0, 10.0)
        require_range(self, "optimizer_bytes_per_param", 0.0, 1e4)
        require_range(self, "loss_logit_copies", 0, 16)
        require_range(self, "loss_parallel_logit_copies", 0, 16)
        require(not self.recompute_modules or self.selective_recompute == "modules", "recompute_modules",
                "is read only with selective_recompute: modules")
        require(self.selective_recompute != "modules" or len(self.recompute_modules) > 0, "recompute_modules",
                "selective_recompute: modules needs the modules it recomputes")
        for name in ("gemm_efficiency", "attention_efficiency"):
            require_range(self, name, 0.0, 1.0, low_open=True)
        names = {f.name for f in dataclasses.fields(self)}
        for i, s in enumerate(self.sources):
            require(s.field in names, f"sources[{i}].field", f"{s.field!r} is not a field of a stack profile")
        for i, f in enumerate(self.fitted):
            require(f.field in names, f"fitted[{i}].field", f"{f.field!r} is not a field of a stack profile")
            require(len(f.runs) > 0, f"fitted[{i}].runs", "name the published runs the value was fitted to")

