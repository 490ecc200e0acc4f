"""Activation bytes a transformer block keeps for its backward pass (Korthikanti et al. 2022, section 4).

Counted per tensor that autograd saves, so that each term can be checked against what PyTorch keeps:

    replicated across TP unless sequence parallel:
        two norm inputs                      2 e sbh
        QKV input (norm output)              e sbh
        MLP input (norm output)              e sbh
        two residual dropout masks           2 sbh      (1-byte masks, only if dropout > 0)
    split across TP:
        Q, K, V (Q is q-wide, K and V kv-wide) e sb(q + 2 kv)
        output-projection input              e sbq
        MLP, GELU: fc1 output, GELU output   2 e sbf
        MLP, SwiGLU: gate, silu(gate), up, product   4 e sbf
    attention core, split across TP (standard attention only; a flash kernel keeps only its
    fp32 log-sum-exp, 4 a s b bytes, besides q, k, v and its output counted above, and reruns the rest):
        softmax output                       e a s^2 b
        attention dropout mask + output      (1 + e) a s^2 b   (only if dropout > 0)

q = heads x head_dim is h unless head_dim is decoupled (Qwen3, whose per-head q/k norms keep their inputs
too, as the block's norms do: e sb(q + kv) more, split across TP). With e = 2, dropout, f = 4h and
q = kv = h this is sbh(34 + 5as/h) unsplit and sbh(10 + 24/t + 5as/(ht)) with TP (Korthikanti Eq. 1 and 2). Selective recomputation drops the attention core; full recomputation
keeps only the block input (e sbh, split by t under sequence parallel, where that input is already
sharded along the sequence).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.split import LayerSplit
from autoplan.schema import ModelSpec, Precision, StackProfile, TrainingSetup


@dataclass(frozen=True)
class SavedBytes:
    """Bytes one block keeps for backward, per micro-batch, on one device."""

    none: float
    selective: float
    full: float


def elem_bytes(precision: Precision) -> int:
    """Bytes of one activation element: 4 in fp32, else 2 (fp8 training keeps activations in bf16)."""
    return 4 if precision == "fp32" else 2


def block_saved_bytes(model: ModelSpec, split: LayerSplit, training: TrainingSetup) -> SavedBytes:
    """Bytes one block keeps for the whole sequence (the caller divides by cp), in the activation dtype, with
    training.attention "flash" or "standard". b, s, h, a, f, t as in Korthikanti et al."""
    e, attention = elem_bytes(training.activation_precision), training.attention
    b, s, tp = split.micro_batch_size, training.seq_len, split.tp
    h, f, q, kv, a = model.hidden_size, model.ffn_hidden_size, model.q_size, model.kv_size, model.num_attention_heads
    sbh = s * b * h
    masks = 2 * sbh if model.dropout > 0 else 0
    replicated = (4 * e * sbh + masks) / split.hidden_shards
    mlp = (4 if model.architecture == "llama" else 2) * e * s * b * f
    qk_norms = e * s * b * (q + kv) if model.qk_norm else 0
    split_bytes = (e * s * b * (q + 2 * kv) + e * s * b * q + mlp + qk_norms) / tp
    if attention == "flash":
        core = 4.0 * a * s * b / tp  # the kernel's fp32 log-sum-exp, one per query row and head
    else:
        core = (e + ((1 + e) if model.dropout > 0 else 0)) * a * s * s * b / tp
    none = replicated + split_bytes + core
    return SavedBytes(none=none, selective=none - (0.0 if attention == "flash" else core),
                      full=e * sbh / split.hidden_shards)


def embedding_saved_bytes(model: ModelSpec, split: LayerSplit, training: TrainingSetup) -> float:
    """Token ids (int64) and, with dropout, the embedding dropout mask."""
    tokens = split.micro_batch_size * training.seq_len
    mask = tokens * model.hidden_size / split.hidden_shards if model.dropout > 0 else 0
    return 8.0 * tokens + mask


def head_input_saved_bytes(model: ModelSpec, split: LayerSplit, training: TrainingSetup) -> float:
    """Final-norm input and projection input (gathered under SP); the loss's fp32 log-softmax over the
    padded vocabulary is added by the vocabulary layer (analytic_ops.head_of_vocabulary)."""
    e = elem_bytes(training.activation_precision)
    sbh = split.micro_batch_size * training.seq_len * model.hidden_size
    return e * sbh / split.hidden_shards + e * sbh


def logits_transient_bytes(tokens: int, tp: int, e: int, vocab: int, fp32_copies: int) -> float:
    """The loss's working memory beyond the fp32 log-softmax the head keeps (``head_of_vocabulary``'s saved
    bytes), one micro-batch of ``tokens`` tokens over ``vocab`` padded rows split over ``tp``. Its peak is
    the larger of ``fp32_copies`` fp32 logit-sized buffers alive at once (``loss_fp32_copies``: the kept
    one, the gradients its backward builds beside it) and one fp32 buffer beside the e-byte logits or their
    gradient (the casts in and out of fp32). Measured on CPU by tests/planner/test_stack_memory_terms.py:
    torch's cross-entropy 12 bytes a logit (3 copies), under ``loss_parallel`` 16 (4), Megatron's 4 + e (1)."""
    return loss_transient_bytes_per_logit(e, fp32_copies) * tokens * vocab / tp


def loss_transient_bytes_per_logit(e: int, fp32_copies: int) -> float:
    """``logits_transient_bytes`` per logit on the rank: the loss's peak less the kept fp32 log-softmax."""
    return max(4.0 * fp32_copies, 4.0 + e) - 4.0


def kept_output_bytes_per_logit(e: int, stack: StackProfile) -> float:
    """Bytes per logit on the rank the last stage keeps of every micro-batch until the step ends under
    pipelining (``StackProfile.pipeline_keeps_outputs``: torch's ``output_chunks``): the model's output, the
    e-byte logits, vocabulary-sharded under TP (loss parallel); 0 where the stack keeps none. Not a saved
    activation: the loss saves its fp32 log-softmax, not the logits, so without this they die with the loss."""
    return float(e) if stack.pipeline_keeps_outputs else 0.0


def loss_fp32_copies(stack: StackProfile, tp: int) -> int:
    """The stack's fp32 logit-sized buffers at the loss's peak: vocabulary-parallel under TP (torch's
    ``loss_parallel``, Megatron's cross-entropy), whole logits otherwise."""
    return stack.loss_parallel_logit_copies if tp > 1 else stack.loss_logit_copies


def repeated_kv_saved_bytes(model: ModelSpec, split: LayerSplit, training: TrainingSetup) -> float:
    """What a block keeps for backward beyond ``block_saved_bytes`` when the stack repeats K and V to every
    query head before the attention kernel (``StackProfile.attention_repeats_kv``): the kernel keeps the
    repeated K and V (q wide each) instead of the grouped ones (kv wide), whole sequence, split over TP."""
    e = elem_bytes(training.activation_precision)
    return 2.0 * e * split.micro_batch_size * training.seq_len * (model.q_size - model.kv_size) / split.tp


def stage_output_bytes(model: ModelSpec, split: LayerSplit, training: TrainingSetup) -> float:
    """Hidden states a pipeline stage sends to the next (sharded along the sequence under SP), whole sequence."""
    e = elem_bytes(training.activation_precision)
    return e * training.seq_len * split.micro_batch_size * model.hidden_size / split.hidden_shards
