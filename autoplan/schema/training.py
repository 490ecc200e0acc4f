"""What is trained and how: batch, sequence, precision, optimizer, and the knobs the runtime needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autoplan.errors import SpecError
from autoplan.schema._io import require, require_range
from autoplan.schema.hardware import Precision
from autoplan.schema.limits import MAX_BATCH_SIZE, MAX_LEARNING_RATE, MAX_SEED, MAX_SEQ_LEN, MAX_STEPS


KNOB_FLAGS = {"--lr": "learning_rate", "--min-lr": "min_learning_rate", "--warmup-steps": "warmup_steps",
              "--decay-steps": "decay_steps", "--lr-schedule": "lr_schedule", "--weight-decay": "weight_decay",
              "--clip-grad": "grad_clip", "--seed": "seed"}
"""The command-line name of each knob (``autoplan run`` and ``runtime.launch`` take the same flags)."""
KNOBS = tuple(KNOB_FLAGS.values())
"""Training fields that change what is learned but not what a step costs: ``autoplan run`` takes them on its
command line (``--lr`` ...), and a run's fingerprint (schema/fingerprint.py) leaves them out."""


def knob_argument(name: str) -> dict[str, object]:
    """``argparse`` keywords for knob ``name``, from its field's type: its destination (``knob_NAME``), and
    its type, or its choices for a Literal; ``autoplan run`` and ``runtime.launch`` both register them."""
    import typing

    kind = typing.get_type_hints(TrainingSetup)[name]
    if typing.get_origin(kind) is Literal:
        return {"dest": f"knob_{name}", "choices": typing.get_args(kind)}
    return {"dest": f"knob_{name}", "type": kind, "metavar": "N" if kind is int else "X"}


def knobs_given(args: object) -> dict[str, object]:
    """The knobs an ``argparse`` namespace holds (field name -> value), those not given left out."""
    return {name: getattr(args, f"knob_{name}") for name in KNOBS if getattr(args, f"knob_{name}", None) is not None}


def with_knobs(training: "TrainingSetup", knobs: dict[str, object]) -> "TrainingSetup":
    """``training`` with ``knobs`` (field name -> value) set and validated; a bad value is one SpecError line
    naming its flag."""
    import dataclasses
    import math

    flags = {name: flag for flag, name in KNOB_FLAGS.items()}
    for name, value in knobs.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(f"{flags.get(name, name)}: {value} is not a finite number")
    changed = dataclasses.replace(training, **knobs)
    try:
        changed.validate()
    except SpecError as err:
        field = str(err).split(":", 1)[0]
        flag = next((f for f, name in KNOB_FLAGS.items() if name == field), None)
        raise SpecError(f"{flag}: {str(err).split(': ', 1)[1]}" if flag and field in knobs else str(err)) from None
    return changed


@dataclass(frozen=True)
class TrainingSetup:
    global_batch_size: int
    """Sequences per optimizer step, summed over data-parallel replicas and micro-batches."""
    seq_len: int
    precision: Precision = "bf16"
    """Compute dtype. bf16/fp16 mean mixed precision with fp32 master weights; fp32 means fp32 throughout;
    fp8 means the linear layers' GEMMs in fp8 with per-tensor scaling (Transformer Engine / torchao style)
    and everything else (attention, norms, activations, communication) in bf16."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """adamw: torch.optim.AdamW (decoupled weight decay); sgd: torch.optim.SGD with momentum (L2 weight decay)."""
    memory_margin: float = 0.1
    """Share of device memory the planner keeps free (allocator fragmentation, NCCL buffers, workspace)."""
    attention: Literal["flash", "standard"] = "flash"
    """``flash``: a fused attention kernel that keeps no s x s scores, only q, k, v, its output and an fp32
    log-sum-exp, and recomputes the scores in backward (FlashAttention on GPUs in bf16/fp16/fp8; in fp32 on a
    GPU torch's memory-efficient kernel, which keeps the same; on CPU torch's flash CPU kernel). It is the
    default everywhere, because torch's SDPA, which the runtime calls, picks such a kernel on every device.
    ``standard``: scores, softmax and dropout as separate kernels that keep the a x s x s tensors for
    backward (Megatron-LM 2021/2022, Korthikanti et al. Table 2)."""
    grad_accumulation_fusion: bool = True
    """The weight-gradient GEMM accumulates straight into the fp32 gradient buffer (Megatron-core's
    ``gradient_accumulation_fusion``, Transformer Engine). False: each micro-batch's weight gradient is
    written in the compute dtype and a separate kernel adds it into the fp32 buffer (Megatron-LM 2021-22's
    ``param.main_grad.add_(param.grad)`` hook, torch's AccumulateGrad): 10 more bytes per parameter moved
    per micro-batch."""
    overlap_grad_reduce: bool = True
    """Data-parallel gradient reduction overlaps the backward pass (DDP buckets / FSDP2 do; Megatron 2021 did not)."""
    learning_rate: float = 3e-4
    min_learning_rate: float = 3e-5
    warmup_steps: int = 10
    decay_steps: int = 1000
    """Steps from the start to the end of the decay (``autoplan run`` sets it to the run's ``--steps`` unless
    ``--decay-steps`` is given)."""
    lr_schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """After the linear warm-up: cosine or linear down to min_learning_rate at decay_steps, or constant."""
    weight_decay: float = 0.1
    """On matrices only (dim >= 2), not on biases and norm weights (nanoGPT's rule)."""
    adam_betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's moment decay rates (beta1, beta2); GPT-3 / Llama pre-training use (0.9, 0.95)."""
    adam_eps: float = 1e-8
    """AdamW's denominator term."""
    sgd_momentum: float = 0.9
    """SGD's momentum factor (0 keeps no momentum buffer)."""
    grad_clip: float = 1.0
    seed: int = 0
    moe_imbalance: float = 1.0
    """Mixture of Experts: tokens the busiest expert receives over its balanced share (1.0: balanced, what
    published MoE benchmarks force; ``--moe-imbalance``). The expert GEMMs and the all-to-all are priced
    for the busiest rank, which every other rank waits for. Left out of files at 1.0."""

    def defaults_omitted(self) -> dict[str, object]:
        """Fields added after plan files existed, left out while at their defaults (schema/_io.py)."""
        return {"moe_imbalance": 1.0}

    def validate(self) -> None:
        # floats are finite (checked on load for every float field); here: the ranges that make sense
        require_range(self, "global_batch_size", 1, MAX_BATCH_SIZE)
        require_range(self, "seq_len", 1, MAX_SEQ_LEN)
        require(0 <= self.memory_margin < 1, "memory_margin", "must be in [0, 1)")
        require_range(self, "learning_rate", 0.0, MAX_LEARNING_RATE, low_open=True)
        require(0 <= self.min_learning_rate <= self.learning_rate, "min_learning_rate",
                f"{self.min_learning_rate} must be in [0, learning_rate = {self.learning_rate}]")
        require_range(self, "warmup_steps", 0, MAX_STEPS)
        require_range(self, "decay_steps", 1, MAX_STEPS)
        require_range(self, "weight_decay", 0.0, 10.0)
        require_range(self, "grad_clip", 0.0, 1e6)  # 0 disables clipping
        require_range(self, "seed", 0, MAX_SEED)
        require(len(self.adam_betas) == 2 and all(0 <= b < 1 for b in self.adam_betas), "adam_betas",
                "needs two values in [0, 1), e.g. [0.9, 0.95]")
        require_range(self, "adam_eps", 0.0, 1.0, low_open=True)
        require(0 <= self.sgd_momentum < 1, "sgd_momentum", "must be in [0, 1)")
        require(1.0 <= self.moe_imbalance <= 64.0, "moe_imbalance",
                f"{self.moe_imbalance} must be in [1, 64] (1.0: every expert gets its balanced share of tokens)")

    def knobs(self) -> dict[str, object]:
        """The fields ``autoplan run`` may override on its command line (``KNOBS``) with their values."""
        return {name: getattr(self, name) for name in KNOBS}

    @property
    def mixed_precision(self) -> bool:
        return self.precision != "fp32"

    @property
    def activation_precision(self) -> Precision:
        """The dtype of activations, communication and every non-GEMM kernel (fp8 keeps those in bf16)."""
        return "bf16" if self.precision == "fp8" else self.precision


RUNTIME_PRECISIONS: tuple[Precision, ...] = ("fp32", "bf16", "fp16")
"""The precisions ``runtime/`` executes. fp8 is planner-only: the runtime has no fp8 linear layers (no
Transformer Engine / torchao float8 in its models), so running an fp8 plan would silently train in another
dtype than the one predicted."""


def require_runnable_precision(training: TrainingSetup) -> None:
    """The one-line refusal ``autoplan run`` (launcher preflight) and every rank (runtime/validate.py) give
    for a plan whose precision the runtime cannot execute."""
    if training.precision not in RUNTIME_PRECISIONS:
        raise SpecError(f"training.precision: {training.precision} plans are planner-only (the runtime has no "
                        f"{training.precision} linear layers); re-plan with --precision bf16 (or one of "
                        f"{', '.join(RUNTIME_PRECISIONS)}) to run it")
