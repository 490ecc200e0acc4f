"""Device (accelerator) profiles: peak speeds, memory, and the efficiency curves the cost model applies.

Units are in the names: ``_tflops`` = 10^12 FLOP/s, ``_gb_per_s`` = 10^9 bytes/s, ``_gib`` = 2^30 bytes,
``_us`` = microseconds. Every efficiency factor is a named field, and ``sources`` says for each field where
its number came from (a kernel-level public measurement, a datasheet, or ``autoplan profile-hardware``);
``matmul_points`` keeps the measured GEMMs a curve was fitted to. Efficiencies come from kernel-level
measurements (one GEMM, one attention kernel, one collective), never from fitting whole training runs.

The three curves (cost/compute.py):

* GEMM: eff(w) = ceiling * w / (w + half_size), w in GFLOP per call: a fixed ramp-up/tail time per call
  (half_size / (ceiling * peak)) on top of the work at the ceiling.
* fused (flash) attention: eff(s) = ceiling * s / (s + half_seq_len), s the sequence length, separately for
  the forward and the backward kernel, counting the FLOPs the kernel executes (half the scores under a
  causal mask) the way the FlashAttention benchmarks count them.
* memory-bound kernels: bytes read + written over ``memory_efficiency`` x the HBM bandwidth.

Host (framework) time, the fields a CPU profile fills in (``autoplan calibrate``). On a GPU the host
queues kernels ahead of the device, so its per-op cost hides behind the kernels and these fields stay 0;
on a CPU the same thread runs the framework and the kernel, one after the other, so every eager op,
autograd node, DTensor wrapper, FSDP2 hook and pipeline action adds its host time to the step:

* ``host_op_us`` / ``host_view_op_us`` per op of a layer's forward (a compute op other than a GEMM or
  an attention kernel, whose fixed costs are part of their own curves; a view op), and
  ``host_backward_op_us`` / ``host_backward_view_op_us`` per op the autograd engine runs in backward,
  counted the way ``TorchDispatchMode`` sees them (cost/analytic_ops.py has the counts per layer);
* ``tp_module_fwd_us`` / ``tp_module_bwd_us`` per DTensor-parallelised module (TP), ``fsdp_unit_fwd_us`` /
  ``fsdp_unit_bwd_us`` per FSDP2 unit, ``pipeline_action_us`` per action of torch's schedule runtime,
  ``optimizer_tensor_us`` / ``optimizer_dtensor_us`` per parameter tensor and optimizer step;
* ``memory_baseline_gib``: what a training process holds besides the model's tensors.

Each is measured by a microbenchmark (autoplan/profiler/hardware/host_overhead.py, distributed_overhead.py),
never fitted to training runs; ``residuals`` keeps every measured point against the fitted value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from autoplan.schema._io import require, require_physical, require_range

Precision = Literal["bf16", "fp16", "fp32", "fp8"]
"""``fp8`` means the linear layers' GEMMs in fp8 with per-tensor scaling and everything else in bf16."""


@dataclass(frozen=True)
class MatmulPoint:
    """One measured GEMM: C[m,n] = A[m,k] @ B[k,n] in ``dtype`` ran at ``tflops``."""

    m: int
    n: int
    k: int
    dtype: Precision
    tflops: float

    def validate(self) -> None:
        for field in ("m", "n", "k"):
            require_range(self, field, 1, 2**24)
        require_range(self, "tflops", 0.0, 1e6, low_open=True)


@dataclass(frozen=True)
class AttentionPoint:
    """One measured fused attention kernel (torch SDPA, causal): ``direction`` at ``seq_len`` tokens and
    ``head_dim`` per head, in ``dtype``, ran at ``tflops`` executed FLOP/s (half the score FLOPs under the
    causal mask; the backward counted as 2.5 x the forward, cost/layer_ops.py)."""

    seq_len: int
    head_dim: int
    direction: Literal["fwd", "bwd"]
    dtype: Precision
    tflops: float


@dataclass(frozen=True)
class Residual:
    """One microbenchmark point against the fitted profile: what was timed, the measured time and the time
    the fitted fields give for it (both microseconds)."""

    field: str
    """The fitted field (or fields, comma-separated) this point informs."""
    point: str
    measured_us: float
    fitted_us: float

    @property
    def relative(self) -> float:
        return (self.fitted_us - self.measured_us) / self.measured_us if self.measured_us else 0.0


@dataclass(frozen=True)
class FieldSource:
    """Where the value of one field of the profile comes from (paper and table, or repository and file)."""

    field: str
    source: str


HOST_FIELDS = ("host_op_us", "host_view_op_us", "host_backward_op_us", "host_backward_view_op_us",
               "tp_module_fwd_us", "tp_module_bwd_us", "fsdp_unit_fwd_us", "fsdp_unit_bwd_us",
               "fsdp_hooks_fwd_us", "fsdp_hooks_bwd_us", "pipeline_action_us", "optimizer_tensor_us",
               "optimizer_dtensor_us")
"""The host-time fields (microseconds), 0 on GPUs."""


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    kind: Literal["gpu", "cpu"]
    memory_gib: float
    """Memory one device has for training (HBM for a GPU; the share of host RAM one rank may use on CPU)."""
    memory_bandwidth_gb_per_s: float
    peak_bf16_tflops: float
    peak_fp16_tflops: float
    peak_fp32_tflops: float
    matmul_efficiency: float
    """Share of peak a large GEMM achieves (the ceiling of the GEMM curve)."""
    matmul_half_size_gflop: float
    """GEMM size (GFLOP per call) at which efficiency is half the ceiling: eff(w) = ceiling * w / (w + this)."""
    memory_efficiency: float
    """Share of memory bandwidth that element-wise kernels (norms, activations, softmax, dropout) achieve."""
    kernel_overhead_us: float = 0.0
    """Fixed launch cost per kernel; matters for small layers and tiny micro-batches."""
    host_link_gb_per_s: float = 25.0
    """Device-to-host bandwidth (PCIe), used when the optimizer state is offloaded."""
    host_adam_gparams_per_s: float = 1.0
    """Host CPU Adam throughput in 10^9 parameters per second (offloaded optimizer step)."""
    peak_fp8_tflops: float = 0.0
    """Dense fp8 tensor-core peak; 0 for a device without fp8 tensor cores (fp8 plans are refused there)."""
    fp8_matmul_efficiency: float = 0.0
    """Ceiling of the fp8 GEMM curve (share of the fp8 peak)."""
    fp8_matmul_half_size_gflop: float = 0.0
    """Half-efficiency size of the fp8 GEMM curve, GFLOP per call."""
    flash_fwd_efficiency: float = 0.0
    """Share of the bf16 peak the fused attention kernel reaches in its forward at long sequences (executed
    FLOPs). 0: not measured for this device; the attention core then runs on the GEMM curve."""
    flash_bwd_efficiency: float = 0.0
    """The same for the backward kernel, whose executed FLOPs are 2.5 x the forward's (it recomputes the
    scores: five matmuls against two)."""
    flash_half_seq_len: float = 0.0
    """Sequence length (tokens) at which the attention kernel reaches half its ceiling."""
    host_op_us: float = 0.0
    """Host time of one eager compute op of a layer's forward, beyond its bytes (dispatch, autograd
    recording, output allocation); GEMM and attention calls are excluded (their curves hold their fixed
    cost). 0: the host runs ahead of the device (GPUs)."""
    host_view_op_us: float = 0.0
    """Host time of one view op (view, transpose, detach: metadata only) in a forward."""
    host_backward_op_us: float = 0.0
    """Host time of one compute op the autograd engine runs in backward (node dispatch included)."""
    host_backward_view_op_us: float = 0.0
    """Host time of one view op in backward."""
    tp_module_fwd_us: float = 0.0
    """Extra host time of one DTensor tensor-parallel module (a ColwiseParallel or RowwiseParallel linear)
    per forward: input/output wrapping, sharding propagation; its collectives are priced separately."""
    tp_module_bwd_us: float = 0.0
    """The same per backward."""
    fsdp_unit_fwd_us: float = 0.0
    """FSDP2 host work per sharded unit per forward (pre/post hooks, all-gather copy-in and copy-out
    bookkeeping), beyond the collective itself."""
    fsdp_unit_bwd_us: float = 0.0
    """FSDP2 host work per unit per backward (hooks, reduce-scatter copies, resharding)."""
    fsdp_hooks_fwd_us: float = 0.0
    """The part of ``fsdp_unit_fwd_us`` a forward pays without gathering (ZeRO-1/2 keep the parameters
    unsharded between a step's first forward and its last backward): the hooks alone."""
    fsdp_hooks_bwd_us: float = 0.0
    """The part of ``fsdp_unit_bwd_us`` a backward pays without reducing (ZeRO-1's micro-batches before the
    last one): the hooks alone."""
    pipeline_action_us: float = 0.0
    """Host work of torch's pipeline schedule runtime per forward or backward action (bookkeeping, posting
    its sends and receives, the stage's autograd call), beyond compute and transfers."""
    optimizer_tensor_us: float = 0.0
    """Host time per parameter tensor per optimizer step (gradient-norm terms, clipping, the AdamW or SGD
    update run tensor by tensor, zero_grad), beyond the bytes it moves."""
    optimizer_dtensor_us: float = 0.0
    """The same for a DTensor parameter (every parameter under FSDP2 or replicate, the TP-sharded ones
    under TP): each update op goes through DTensor's dispatch."""
    optimizer_ns_per_param: float = 0.0
    """Time per parameter of the runtime's optimizer step (gradient norm, clipping, AdamW) on a device that
    runs it op by op (torch's single-tensor AdamW on a CPU reads and writes each state several times:
    ~100 bytes per fp32 parameter against the fused kernels' 40); 0: ``optimizer_step_bytes`` over the
    memory bandwidth (cost/model_states.py)."""
    memory_baseline_gib: float = 0.0
    """Memory a training process holds besides the model's tensors, as the runtime's meter counts it: the
    heap of torch, its distributed packages and the process group on a CPU rank (glibc mallinfo2). 0 on
    a GPU, where torch.cuda.max_memory_allocated counts tensors only."""
    probe_gemm_us: float = 0.0
    """A CPU host's time for the fixed probe GEMM (runtime/train/speed_probe.py) while it was calibrated;
    runs time it again, and ``autoplan compare`` re-evaluates the plan at the speed they ran (a shared host
    drifts). 0: not measured (GPUs, older calibrations)."""
    probe_op_us: float = 0.0
    """The same for the fixed probe eager op (host speed)."""
    source: str = ""
    sources: tuple[FieldSource, ...] = ()
    """Per-field sources of the numbers above."""
    matmul_points: tuple[MatmulPoint, ...] = ()
    attention_points: tuple[AttentionPoint, ...] = ()
    """Measured attention kernels; when given for the activation dtype, the attention core is priced by
    interpolating them in (log seq_len, log head_dim) instead of the flash curve (cost/compute.py)."""
    residuals: tuple[Residual, ...] = ()
    """Microbenchmark points against the fitted fields (``autoplan calibrate``)."""

    def validate(self) -> None:
        require(0 < len(self.name) <= 200, "name", "must be 1 to 200 characters")
        # every field with a unit suffix: peaks and bandwidths > 0, times >= 0, efficiencies in (0, 1];
        # the fp8 and flash-attention fields may be 0 where the device has no such kernel or it was not measured
        require_physical(self, zero_means_absent=("peak_fp8_tflops", "fp8_matmul_efficiency", "flash_fwd_efficiency",
                                                  "flash_bwd_efficiency", "memory_baseline_gib"))
        require(self.flash_half_seq_len >= 0, "flash_half_seq_len", "must be >= 0")
        require(self.optimizer_ns_per_param >= 0, "optimizer_ns_per_param", "must be >= 0 (0: memory-bound step)")
        require(self.peak_fp8_tflops == 0 or self.fp8_matmul_efficiency > 0, "fp8_matmul_efficiency",
                "a device with an fp8 peak needs its fp8 GEMM ceiling")
        require((self.flash_fwd_efficiency > 0) == (self.flash_bwd_efficiency > 0), "flash_bwd_efficiency",
                "give both flash_fwd_efficiency and flash_bwd_efficiency, or neither")
        for i, p in enumerate(self.attention_points):
            require(p.seq_len >= 1 and p.head_dim >= 1 and p.tflops > 0, f"attention_points[{i}]",
                    "needs seq_len, head_dim >= 1 and tflops > 0")
        names = {f.name for f in dataclasses.fields(self)}
        for i, s in enumerate(self.sources):
            require(s.field in names, f"sources[{i}].field", f"{s.field!r} is not a field of a device profile")

    def peak_tflops(self, precision: Precision) -> float:
        return {"bf16": self.peak_bf16_tflops, "fp16": self.peak_fp16_tflops, "fp32": self.peak_fp32_tflops,
                "fp8": self.peak_fp8_tflops}[precision]

    def source_of(self, field: str) -> str:
        """The recorded source of one field ('' if none was given)."""
        return next((s.source for s in self.sources if s.field == field), "")
