"""Context parallelism's own costs: torch's ring attention, as the runtime runs it on every device.

The runtime (runtime/parallel/context_parallel.py) runs torch 2.13's ring loop
(``_templated_ring_attention`` and its backward in torch/distributed/tensor/experimental/_context_parallel/
_attention.py, the code behind ``context_parallel``) with its default options. What that code does, and
what is modelled here and in cost/analytic_ops.py:

* Sharding: the head-tail load balancer (``_HeadTailLoadBalancer``, torch's default whenever seq_len is
  divisible by 2 cp; often called "zigzag"): the sequence is cut into 2 cp chunks of c = s / (2 cp) tokens
  and rank r keeps chunks r and 2cp-1-r. Every token-linear op (the GEMMs, norms, activations, the loss,
  the activations kept for backward, the TP collectives) runs on s / cp tokens per rank.
* Work: ring step 0 runs the causal kernel on the rank's own 2c queries x 2c keys (2 c^2 pairs after the
  mask); every step i > 0 runs an unmasked kernel on 2c queries x the first received chunk (i <= r) or on
  the second local chunk (c queries) x both received chunks (i > r): 2 c^2 pairs either way. Each rank
  computes 2 c^2 cp = (s^2 / 2) / cp pairs, exactly 1/cp of the causal work: no imbalance to model. It
  takes cp kernel calls per direction, each on s / cp queries (the length the flash curve is read at).
* Exchange (rotate method "allgather", torch's default ``_cp_options.rotate_method``): forward, one
  all-gather of the K and V shards (each rank receives cp - 1 shards of 2 x s/cp x kv elements, in the
  activation dtype), issued before step 0 and awaited at step 1, so only step 0's kernel (1/cp of the
  attention forward) hides it. Backward: the all-gather again, hidden behind step 0's backward kernel;
  then the dK/dV accumulators travel the ring (``_AllToAllRotater``, a permute: each rank sends to the
  next), cp times, in fp32 (``convert_to_f32``); exchange i is awaited after step i+1's kernel, which hides
  it, and the last one right after the loop, which nothing hides. Nothing else overlaps: the waits sit
  inside the attention call, so the block's GEMMs never run beside the exchange. Ring Attention (Liu et
  al. 2023, section 3) and Megatron-LM's CP overlap each step's send with that step's kernel instead;
  torch's all-gather trades that for one collective per direction.
* Merge: torch merges each step's output into the running one by log-sum-exp in eager fp32 kernels
  (``_SDPAMerger``), and accumulates dQ, dK, dV in fp32; ``ring_exchange`` counts those bytes.
* Grouped-query attention: the ring carries K and V as the attention call receives them. This runtime
  passes them grouped (kv_heads wide; its kernels expand them per step, runtime/parallel/
  context_parallel.py); torchtitan 9dec370 repeats them to every query head first (``repeat_kv`` in
  models/llama/model.py, before ``F.scaled_dot_product_attention``), so its all-gather, gathered buffer,
  dK/dV ring and merges carry heads / kv_heads times the bytes (``with_repeated_kv``,
  ``StackProfile.attention_repeats_kv``): 16x at Llama 3.1 405B.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.comm import GroupLink, collective_time_s

# Bytes per output element of one merge step (``_SDPAMerger._merge_one`` and ``step``): the block output
# cast to fp32 (read e, write 4), out - block_out (read 8, write 4), times sigmoid(lse diff) (read 4,
# write 4), out - that (read 8, write 4): 36 + e. A partial step (i > r) merges half the rows but
# rewrites the whole output (``_partial_update``: 26 + e / 2); counted as a whole one. Ten kernels: the
# two casts, three on the output, five on the log-sum-exp (one value per query row and head).
MERGE_FWD_FP32_BYTES = 36
MERGE_FWD_KERNELS = 10
# Backward, per step: dQ += the kernel's dQ (read 4 + e, write 4), dK and dV likewise plus their
# concatenation for the next send (read 4, write 4): 8 + e per query element, 16 + e per K/V element.
# Five kernels: three additions, the concatenation, the chunk update of a partial step.
MERGE_BWD_Q_FP32_BYTES = 8
MERGE_BWD_KV_FP32_BYTES = 16
MERGE_BWD_KERNELS = 5
FP32 = 4


@dataclass(frozen=True)
class RingExchange:
    """One block's ring attention on one rank of a CP group of ``cp``."""

    cp: int
    kv_bytes: float
    """This rank's K and V shards together (s / cp tokens), activation dtype: what the all-gather sends."""
    grad_kv_bytes: float
    """Its dK and dV accumulators (fp32): what each backward ring step sends."""
    merge_fwd_bytes: float
    """Memory-bound bytes of the forward's merges, K/V concatenation and final cast."""
    merge_bwd_bytes: float
    merge_fwd_kernels: int
    merge_bwd_kernels: int
    q_elements: float = 0.0
    """This rank's query (and output) elements: what ``ring_exchange`` was given."""
    kv_elements: float = 0.0
    """Its K and V elements together, as the ring carries them."""
    elem_bytes: int = 2

    @property
    def transient_bytes(self) -> float:
        """Working memory while the ring runs (freed after the block's attention): the gathered K/V of the
        whole sequence (cp x kv_bytes, the all-gather's output) and, in backward, the dK/dV accumulator in
        flight beside the one being added to (2 x grad_kv_bytes)."""
        return self.cp * self.kv_bytes + 2 * self.grad_kv_bytes


def ring_exchange(cp: int, q_elements: float, kv_elements: float, e: int) -> RingExchange:
    """The ring of one block: ``q_elements`` query (and output) elements on this rank, ``kv_elements``
    K and V elements together, activations of ``e`` bytes."""
    # torch.cat([k, v]) for the next send (read e, write e): the loops of both directions concatenate at every
    # step but the last, though the all-gather rotater sends only the first (``exchange_buffers``)
    concat = (cp - 1) * 2 * e * kv_elements
    fwd = (cp - 1) * (MERGE_FWD_FP32_BYTES + e) * q_elements + (FP32 + e) * q_elements + concat
    per_step = (MERGE_BWD_Q_FP32_BYTES + e) * q_elements + (MERGE_BWD_KV_FP32_BYTES + e) * kv_elements
    bwd = cp * per_step + (FP32 + e) * (q_elements + kv_elements) + concat  # + the final casts to e
    return RingExchange(cp=cp, kv_bytes=e * kv_elements, grad_kv_bytes=FP32 * kv_elements, merge_fwd_bytes=fwd,
                        merge_bwd_bytes=bwd, merge_fwd_kernels=(cp - 1) * (MERGE_FWD_KERNELS + 1),
                        merge_bwd_kernels=cp * MERGE_BWD_KERNELS + cp - 1, q_elements=q_elements,
                        kv_elements=kv_elements, elem_bytes=e)


def with_repeated_kv(ring: RingExchange, repeats: int) -> RingExchange:
    """The same ring carrying K and V repeated ``repeats`` times (every query head's copy: module doc): the
    all-gather, the gathered buffer, the dK/dV ring and the K/V merges all scale with the K/V width."""
    if repeats == 1:
        return ring
    return ring_exchange(ring.cp, ring.q_elements, ring.kv_elements * repeats, ring.elem_bytes)


def permute_time_s(size_bytes: float, link: GroupLink) -> float:
    """One ring step of a permute: every rank sends ``size_bytes`` to the next at once (one hop)."""
    return link.base_latency_s + link.latency_s + size_bytes / link.bandwidth_bytes_per_s


def all_gather_time_s(ring: RingExchange, link: GroupLink) -> float:
    """The K/V all-gather: (cp - 1) / cp of the gathered cp x kv_bytes (cost/comm.py's ring model)."""
    return collective_time_s("all_gather", ring.cp * ring.kv_bytes, link)


def ring_exposed_s(ring: RingExchange, attention_fwd_s: float, attention_bwd_s: float,
                   link: GroupLink) -> tuple[float, float]:
    """(forward, backward) seconds of the exchange that the attention kernels do not hide (module docstring).

    ``attention_*_s``: the rank's attention kernels of one direction, cp steps of equal work."""
    if ring.cp <= 1:
        return 0.0, 0.0
    gather = all_gather_time_s(ring, link)
    step_fwd, step_bwd = attention_fwd_s / ring.cp, attention_bwd_s / ring.cp
    permute = permute_time_s(ring.grad_kv_bytes, link)
    forward = max(0.0, gather - step_fwd)
    backward = max(0.0, gather - step_bwd) + (ring.cp - 1) * max(0.0, permute - step_bwd) + permute
    return forward, backward
