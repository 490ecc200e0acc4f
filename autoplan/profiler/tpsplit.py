"""Finding the tensor-parallel splits of a layer from its traced dataflow graph.

Megatron's rule, stated on the graph: a linear ``R`` can be split row-wise (input features sharded) when
every path that brings data into ``R``'s input starts at the output of a linear ``C`` of the same layer and
passes only through ops that act on each feature independently (element-wise ops, views and copies,
dropout) or on each head independently (the attention core: batched matmuls of two activations, softmax,
masks, and norms over the last axis of a [.., heads, head_dim] tensor). Those ``C`` then split
column-wise (output features sharded), each rank computes its shard of ``R``'s input locally, and one all-reduce after ``R`` completes the layer. A norm, a reduction over the
hidden axis, or the layer's own hidden input on such a path breaks the pattern. Tensors that do not
depend on the layer's hidden input (RoPE tables, masks) are replicated on every rank and do not matter.

A "linear" is any module ``trace.linear_features`` recognises: ``nn.Linear`` and Hugging Face's
``Conv1D`` (GPT-2 stores its projections [in, out]; its fused ``c_attn`` is one column linear feeding
``c_proj`` through ``split`` and the attention core).

The graph is a networkx DiGraph with tensor nodes ``("t", id)`` and op nodes ``("op", index)``.
"""

from __future__ import annotations

import networkx as nx

from autoplan.profiler.trace import LinearCall, OpRecord, Trace
from autoplan.schema.profile import TpSplit

# Ops that act per feature or per head (not tagged pointwise by aten, but safe on a feature shard).
PER_SHARD_OPS = {
    "view", "_unsafe_view", "reshape", "transpose", "permute", "expand", "unsqueeze", "squeeze", "clone",
    "contiguous", "slice", "select", "split", "split_with_sizes", "chunk", "unbind", "cat", "stack", "alias",
    "detach", "_to_copy", "copy_", "flatten", "unflatten", "t", "native_dropout", "dropout",
    "bernoulli", "bernoulli_",  # a dropout mask drawn per element (the math attention's dropout on meta)
    "bmm", "matmul", "baddbmm", "_softmax", "softmax", "_safe_softmax", "masked_fill", "where", "tril",
    "repeat_interleave", "index_select", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "scaled_dot_product_attention", "lift_fresh",
    # allocations shaped like an activation carry none of its data
    "empty_like", "zeros_like", "ones_like", "full_like", "new_empty", "new_zeros", "new_ones", "empty_strided",
    "fill_", "zero_",
}


def _op_base(name: str) -> str:
    """``aten.native_dropout.default`` -> ``native_dropout``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else name


def _allowed(op: OpRecord) -> bool:
    return op.pointwise or op.per_head_reduction or _op_base(op.name) in PER_SHARD_OPS


def segment_graph(ops: list[OpRecord], segment: str) -> nx.DiGraph:
    graph = nx.DiGraph()
    for i, op in enumerate(ops):
        if op.segment != segment:
            continue
        node = ("op", i)
        graph.add_node(node, op=op)
        for t in op.inputs:
            graph.add_edge(("t", t), node)
        for t in op.outputs:
            graph.add_edge(node, ("t", t))
    return graph


def _columns_feeding(graph: nx.DiGraph, row: LinearCall, by_output: dict[int, LinearCall],
                     dependent: set, hidden: tuple) -> list[LinearCall] | None:
    """The column linears whose outputs reach ``row``'s input through per-shard ops only, or None."""
    columns: dict[str, LinearCall] = {}
    stack, seen = [("t", row.input_id)], set()
    while stack:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        if tensor[1] in by_output:
            columns.setdefault(by_output[tensor[1]].fqn, by_output[tensor[1]])
            continue
        if tensor == hidden:
            return None  # the layer input reaches the row linear unsplit
        if tensor not in dependent:
            continue  # replicated (RoPE tables, masks, constants)
        for producer in graph.predecessors(tensor):
            if not _allowed(graph.nodes[producer]["op"]):
                return None
            stack.extend(graph.predecessors(producer))
    return list(columns.values()) or None


def find_tp_splits(trace: Trace, segment: str, prefix: str) -> tuple[TpSplit, ...]:
    """The (columns -> row) groups of one layer; names are relative to the layer's FQN ``prefix``."""
    hidden_id = trace.hidden_input.get(segment)
    if hidden_id is None:
        return ()
    graph = segment_graph(trace.ops, segment)
    hidden = ("t", hidden_id)
    dependent = nx.descendants(graph, hidden) if hidden in graph else set()
    linears = [call for call in trace.linears if call.segment == segment]
    by_output = {call.output_id: call for call in linears}
    splits, used = [], set()
    for row in linears:
        columns = _columns_feeding(graph, row, by_output, dependent, hidden)
        if not columns or any(c.fqn in used or c.fqn == row.fqn for c in columns):
            continue
        used.update(c.fqn for c in columns)
        used.add(row.fqn)
        order = {c.fqn: i for i, c in enumerate(linears)}
        columns.sort(key=lambda c: order[c.fqn])
        splits.append(TpSplit(columns=tuple(_relative(c.fqn, prefix) for c in columns),
                              row=_relative(row.fqn, prefix)))
    return tuple(splits)


def _relative(fqn: str, prefix: str) -> str:
    return fqn[len(prefix) + 1:] if fqn.startswith(prefix + ".") else fqn
