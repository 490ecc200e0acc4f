"""What one traced layer runs, in the cost model's terms: GEMM shapes, the attention core, memory-bound bytes.

From the ops a segment (``embedding``, a block, ``head``) dispatched (trace.py tags each op's kind):

* GEMMs: every matmul with a parameter operand, as (m, n, k) with the batch folded into the count, in
  call order.
* attention: the SDPA calls (one fused kernel each: what runs inside the flash-emulated SDPA is not counted
  as GEMMs or element-wise work) and matmuls of two activations (eager attention); their shape and FLOPs.
* memory-bound bytes, under the rule the analytic model uses (cost/analytic_ops.py): the element-wise ops
  between two GEMMs run as one fused kernel. Connected element-wise ops form a region; a region reads each
  tensor it takes from outside once and writes each tensor that leaves it (consumed by a GEMM, the
  attention core or a later layer, saved for backward, or the layer's output) once; what stays inside is
  free. A parameter read by an element-wise op counts at most the op's output size (an embedding lookup
  reads the rows it gathers, not the table). Views and allocations move nothing.

Pure Python over the trace records (no torch calls), so its rule can be read and tested on its own.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from autoplan.profiler.trace import OpRecord, Trace


@dataclass(frozen=True)
class SegmentOps:
    gemms: tuple[tuple[int, int, int, int], ...]
    """(m, n, k, count) in call order, consecutive equal shapes merged."""
    attention: tuple[int, int, int] | None
    """(batch x heads, sequence length, head dim) of the segment's attention core, if it has one."""
    attention_flops: int
    elementwise_bytes: int
    elementwise_kernels: int


@dataclass(frozen=True)
class TraceIndex:
    """Who produced and who consumed each tensor (views resolved to the tensor they view)."""

    producer: dict[int, int]
    consumers: dict[int, set[int]]
    by_segment: dict[str, list[int]]


def index_trace(trace: Trace) -> TraceIndex:
    producer: dict[int, int] = {}
    consumers: dict[int, set[int]] = defaultdict(set)
    by_segment: dict[str, list[int]] = defaultdict(list)
    for i, op in enumerate(trace.ops):
        by_segment[op.segment].append(i)
        for t in op.outputs:
            producer.setdefault(_base(trace, t), i)
        for t in op.inputs:
            consumers[_base(trace, t)].add(i)
    return TraceIndex(producer, consumers, by_segment)


def segment_ops(trace: Trace, segment: str, index: TraceIndex | None = None) -> SegmentOps:
    index = index or index_trace(trace)
    ops = [(i, trace.ops[i]) for i in index.by_segment.get(segment, [])]
    return SegmentOps(gemms=_gemms(op for _, op in ops), attention=_attention(op for _, op in ops),
                      attention_flops=sum(op.flops for _, op in ops if op.kind == "attention"),
                      **_elementwise(trace, index, ops))


def _gemms(ops) -> tuple[tuple[int, int, int, int], ...]:
    """Run-length encoded in call order (consecutive equal shapes merged), so that the GEMMs of one layer
    at two TP sizes pair up call by call."""
    runs: list[list[int]] = []
    for op in ops:
        if op.kind == "gemm":
            batch, m, n, k = op.shape
            if runs and runs[-1][:3] == [m, n, k]:
                runs[-1][3] += batch
            else:
                runs.append([m, n, k, batch])
    return tuple(tuple(r) for r in runs)


def _attention(ops) -> tuple[int, int, int] | None:
    """The first attention op's shape: an SDPA call gives (bh, sq, sk, d); an eager score matmul
    (b h, s, s, d) the same layout."""
    for op in ops:
        if op.kind == "attention" and len(op.shape) == 4:
            bh, sq, _, d = op.shape
            return bh, sq, d
    return None


def _base(trace: Trace, t: int) -> int:
    while t in trace.view_base:
        t = trace.view_base[t]
    return t


def _elementwise(trace: Trace, index: TraceIndex, ops: list[tuple[int, OpRecord]]) -> dict:
    producer, consumers = index.producer, index.consumers
    members = [i for i, op in ops if op.kind == "elementwise"]
    parent = {i: i for i in members}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in members:
        for t in trace.ops[i].inputs:
            p = producer.get(_base(trace, t))
            if p in parent:
                parent[find(i)] = find(p)
    regions: dict[int, list[int]] = defaultdict(list)
    for i in members:
        regions[find(i)].append(i)
    leaving = {_base(trace, t) for t in trace.output_ids.values()}
    total = 0
    for region in regions.values():
        inside = set(region)
        read: dict[int, int] = {}
        written: set[int] = set()
        for i in region:
            op = trace.ops[i]
            out_bytes = sum(trace.nbytes.get(t, 0) for t in op.outputs)
            for t in op.inputs:
                b = _base(trace, t)
                if producer.get(b) in inside:
                    continue
                size = trace.nbytes.get(t, 0)
                if trace.storage_of.get(b) in trace.param_storage or b not in producer:
                    size = min(size, out_bytes)  # a parameter: a gather reads what it writes
                read[b] = max(read.get(b, 0), size)
            for t in op.outputs:
                b = _base(trace, t)
                if (consumers[b] - inside or trace.storage_of.get(b) in trace.saved_storage or b in leaving):
                    written.add(b)
        total += sum(read.values()) + sum(trace.nbytes.get(b, 0) for b in written)
    return {"elementwise_bytes": total, "elementwise_kernels": len(regions)}
