"""Dispatch-level tracing: one forward pass recorded as aten ops, each tagged with the layer it ran in.

Why dispatch-level (a ``TorchDispatchMode``) and not torch.fx or torch.export: fx fails on the
data-dependent Python that HF models are full of (cache objects, mask helpers, ``if`` on shapes) and sees
``F.linear`` but not what autograd keeps; export handles more but costs seconds per call, needs example
inputs that satisfy its guards, and rebuilds the module. The dispatch mode instead sits under the real
forward, so whatever runs eagerly traces; it sees every aten op with its real (meta) inputs and outputs,
which gives FLOPs (torch's own ``flop_registry``), a dataflow graph for finding TP splits, and, together
with ``saved_tensors_hooks``, the bytes autograd saves. Module hooks say which layer is running.

Tensor identity in the graph is the Python object (``id``); every tensor is kept alive until the trace is
dropped so that ids are never reused. On meta that costs no memory.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

EMBEDDING, HEAD = "embedding", "head"


@dataclass
class OpRecord:
    name: str
    """aten overload, e.g. ``aten.mm.default``."""
    segment: str
    module: str
    """Innermost module FQN running when the op was dispatched."""
    inputs: list[int]
    outputs: list[int]
    pointwise: bool
    flops: int
    per_head_reduction: bool = False
    """A reduction over the last axis only of a tensor with a heads axis (ndim >= 4): a per-head norm
    (Qwen3's q_norm/k_norm), which acts within one head and so within one TP shard."""
    kind: str = "elementwise"
    """What the cost model prices it as (op_classes.py): ``gemm`` (a matmul with a parameter operand),
    ``attention`` (inside SDPA, or a matmul of two activations), ``free`` (views, allocations), or
    ``elementwise`` (everything else that reads and writes memory)."""
    shape: tuple[int, ...] = ()
    """(batch, m, n, k) of a matmul; (batch x heads, query length, key length, head dim) of an SDPA call."""


def linear_features(module: nn.Module) -> tuple[int, int] | None:
    """(in, out) features of a module computing x W + b over the last axis, or None: ``nn.Linear`` (weight
    [out, in]) and Hugging Face's ``Conv1D`` (GPT-2's projections: weight [in, out], ``nf`` outputs),
    recognised by its name and shape so that tracing needs no ``transformers`` import."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2 \
            and weight.shape[1] == getattr(module, "nf", None):
        return weight.shape[0], weight.shape[1]
    return None


@dataclass
class LinearCall:
    fqn: str
    segment: str
    input_id: int
    output_id: int
    in_features: int
    out_features: int


@dataclass
class SavedTensor:
    segment: str
    module: str
    op: str
    """The last aten op dispatched before autograd saved the tensor (the op whose backward needs it)."""
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass
class Trace:
    """Everything one forward pass showed, keyed by segment (``embedding``, a block FQN, ``head``)."""

    segments: list[str]
    ops: list[OpRecord] = field(default_factory=list)
    linears: list[LinearCall] = field(default_factory=list)
    saved: list[SavedTensor] = field(default_factory=list)
    params: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    shared_params: int = 0
    """Parameters used by a later segment than the one that owns them (a tied head weight)."""
    param_bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    param_tensors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    output_bytes: dict[str, int] = field(default_factory=dict)
    hidden_input: dict[str, int] = field(default_factory=dict)
    """id of each block's hidden-state input (its first floating-point tensor argument)."""
    block_inputs: dict[str, tuple[tuple, dict]] = field(default_factory=dict)
    """(args, kwargs) each block was called with (meta tensors), to rebuild inputs for timing."""
    hidden_width: int | None = None
    nbytes: dict[int, int] = field(default_factory=dict)
    """Bytes of every tensor the ops saw (numel x element size, by id)."""
    view_base: dict[int, int] = field(default_factory=dict)
    """id of a view -> id of the tensor it views (one step)."""
    storage_of: dict[int, int] = field(default_factory=dict)
    saved_storage: set[int] = field(default_factory=set)
    """Storages autograd saved for backward."""
    param_storage: set[int] = field(default_factory=set)
    output_ids: dict[str, int] = field(default_factory=dict)
    """id of the tensor each segment hands on (its first tensor output)."""
    keepalive: list[Any] = field(default_factory=list)

    def flops(self, segment: str) -> int:
        return sum(op.flops for op in self.ops if op.segment == segment)

    def saved_bytes(self, segment: str) -> int:
        return sum(s.nbytes for s in self.saved if s.segment == segment)


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class _State:
    """Which segment and module are running; shared by the hooks and the dispatch mode."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names
        self.segment = EMBEDDING
        self.module_stack: list[str] = [""]
        self.last_op = ""
        self.in_sdpa = 0
        self.sdpa_shape: tuple[int, ...] = ()

    def sdpa_event(self, entering: bool, q: torch.Tensor, k: torch.Tensor) -> None:
        """Called by the flash-emulated SDPA around its math (attention.py): what runs inside is one
        fused attention kernel, not GEMMs and element-wise ops."""
        self.in_sdpa += 1 if entering else -1
        if entering:
            heads = q.numel() // (q.shape[-2] * q.shape[-1])
            self.sdpa_shape = (heads, q.shape[-2], k.shape[-2], q.shape[-1])


class _Recorder(TorchDispatchMode):
    def __init__(self, trace: Trace, state: _State, param_owner: dict[int, tuple[str, int, int]]) -> None:
        super().__init__()
        self.trace, self.state = trace, state
        self.param_owner = param_owner  # storage key -> (name, numel, nbytes), popped on first use
        self.claimed: dict[int, tuple[str, int]] = {}  # storage key -> (segment, numel)
        self.sdpa_recorded = 0  # SDPA calls already given an op record

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default and args[0].is_meta:
            return meta_item(args[0])
        out = func(*args, **kwargs)
        flat_in = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        flat_out = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self._claim_params(flat_in)
        packet = func._overloadpacket
        flops = int(flop_registry[packet](*args, **kwargs, out_val=out)) if packet in flop_registry else 0
        name = str(func)
        self.state.last_op = name
        kind, shape = self._kind(func, args, flat_in, flops)
        self.trace.ops.append(OpRecord(name, self.state.segment, self.state.module_stack[-1],
                                       [id(t) for t in flat_in], [id(t) for t in flat_out],
                                       torch.Tag.pointwise in func.tags, flops, _per_head_reduction(func, args),
                                       kind, shape))
        self._remember(func, flat_in, flat_out)
        self.trace.keepalive.extend(flat_out)
        return out

    def _kind(self, func, args: tuple, flat_in: list[torch.Tensor], flops: int) -> tuple[str, tuple[int, ...]]:
        base = func._overloadpacket.__name__
        if self.state.in_sdpa or base in _FUSED_ATTENTION:
            return "attention", self.state.sdpa_shape if self.state.in_sdpa else _sdpa_shape(args)
        if base in _MATMULS and flops > 0:
            params = self.trace.param_storage
            uses_param = any(_storage_key(t) in params for t in flat_in)
            return ("gemm" if uses_param else "attention"), _matmul_shape(base, args)
        if func.is_view or base in _ALIASES or not flat_in:
            return "free", ()
        return "elementwise", ()

    def _remember(self, func, flat_in: list[torch.Tensor], flat_out: list[torch.Tensor]) -> None:
        for t in flat_in + flat_out:
            self.trace.nbytes.setdefault(id(t), t.numel() * t.element_size())
        for t in flat_out:
            self.trace.storage_of[id(t)] = _storage_key(t)
        for t in flat_in:  # parameters and inputs are no op's output: op_classes asks whose storage they are
            self.trace.storage_of.setdefault(id(t), _storage_key(t))
        if (func.is_view or func._overloadpacket.__name__ in _ALIASES) and flat_in and flat_out:
            self.trace.view_base[id(flat_out[0])] = id(flat_in[0])

    def _claim_params(self, tensors: list[torch.Tensor]) -> None:
        """A parameter belongs to the segment that first uses it, so a tied head weight counts once."""
        for t in tensors:
            key = _storage_key(t)
            owner = self.param_owner.pop(key, None) if self.param_owner else None
            if owner is not None:
                self.trace.params[self.state.segment] += owner[1]
                self.trace.param_bytes[self.state.segment] += owner[2]
                self.trace.param_tensors[self.state.segment] += 1
                self.claimed[key] = (self.state.segment, owner[1])
            elif key in self.claimed and self.claimed[key][0] != self.state.segment:
                self.trace.shared_params += self.claimed.pop(key)[1]


_MATMULS = {"mm", "addmm", "bmm", "baddbmm", "addbmm"}
_ALIASES = {"_unsafe_view", "lift_fresh", "detach"}  # views that aten does not tag as views
_FUSED_ATTENTION = {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"}


def _matmul_shape(base: str, args: tuple) -> tuple[int, ...]:
    """(batch, m, n, k) of mm(a, b), addmm(c, a, b), bmm(a, b), baddbmm(c, a, b), addbmm(c, a, b)."""
    a, b = (args[1], args[2]) if base in ("addmm", "baddbmm", "addbmm") else (args[0], args[1])
    batch = a.shape[0] if a.dim() == 3 and base != "addbmm" else 1
    return batch, a.shape[-2], b.shape[-1], a.shape[-1]


def _sdpa_shape(args: tuple) -> tuple[int, ...]:
    q, k = args[0], args[1]
    return q.numel() // (q.shape[-2] * q.shape[-1]), q.shape[-2], k.shape[-2], q.shape[-1]


_LAST_AXIS_REDUCTIONS = {"mean", "sum", "var", "var_mean", "amax", "norm", "linalg_vector_norm"}
_NORMS = {"native_layer_norm", "_fused_rms_norm", "rms_norm"}


def _per_head_reduction(func, args: tuple) -> bool:
    base = func._overloadpacket.__name__
    if not args or not isinstance(args[0], torch.Tensor) or args[0].dim() < 4:
        return False
    if base in _NORMS:
        return len(args) > 1 and len(args[1]) == 1  # normalized_shape: the last axis only
    if base in _LAST_AXIS_REDUCTIONS:
        dims = args[1] if len(args) > 1 else None
        dims = [dims] if isinstance(dims, int) else dims
        return bool(dims) and all(d in (-1, args[0].dim() - 1) for d in dims)
    return False


def meta_item(t: torch.Tensor) -> bool | int:
    """A meta tensor has no value, yet HF code asks ``.item()``/``.all()`` of masks and position ids
    ("is the padding mask all ones?", "are the sequences unpacked?"). For a bool we answer True, which is
    the training case of full, unpacked sequences; for a number 0."""
    return True if t.dtype == torch.bool else 0


def _tensor_bytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_flatten(obj)[0]
               if isinstance(t, torch.Tensor) and t.is_floating_point())


def _first_float(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for t in tree_flatten((args, kwargs.get("hidden_states"), kwargs))[0]:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return t
    return None


@contextlib.contextmanager
def _hooks(model: nn.Module, blocks: list[tuple[str, nn.Module]], trace: Trace, state: _State) -> Iterator[None]:
    handles = []
    block_ids = {id(b): name for name, b in blocks}

    def pre(module, args, kwargs):
        state.module_stack.append(state.names.get(id(module), type(module).__name__))
        name = block_ids.get(id(module))
        if name is not None:
            state.segment = name
            hidden = _first_float(args, kwargs)
            if hidden is not None:
                trace.hidden_input[name] = id(hidden)
                trace.hidden_width = hidden.shape[-1]
                if name == blocks[0][0]:
                    trace.output_bytes[EMBEDDING] = _tensor_bytes(hidden)
            trace.block_inputs[name] = (args, kwargs)

    def post(module, args, kwargs, output):
        state.module_stack.pop()
        name = block_ids.get(id(module))
        if name is not None:
            trace.output_bytes[name] = _tensor_bytes(output if isinstance(output, torch.Tensor) else
                                                     tree_flatten(output)[0][:1])
            first = output if isinstance(output, torch.Tensor) else next(
                (t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)), None)
            if first is not None:
                trace.output_ids[name] = id(first)
            state.segment = HEAD
        features = linear_features(module)
        if features is not None and isinstance(output, torch.Tensor):
            x = args[0] if args else next(iter(kwargs.values()))  # nn.Linear's "input", Conv1D's "x"
            trace.linears.append(LinearCall(state.names.get(id(module), "?"), state.segment, id(x), id(output),
                                            *features))

    for module in model.modules():
        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _pack_hook(trace: Trace, state: _State, param_keys: set[int], seen: set[int]):
    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        trace.saved_storage.add(key)
        if key not in param_keys and key not in seen:
            seen.add(key)
            nbytes = t.untyped_storage().nbytes()
            trace.saved.append(SavedTensor(state.segment, state.module_stack[-1], state.last_op,
                                           tuple(t.shape), str(t.dtype).replace("torch.", ""), nbytes))
        return t
    return pack


def call_with(model: nn.Module, batch: Any) -> Any:
    """``model(batch)`` for a tensor, a tuple of positional arguments, or a dict of keyword arguments."""
    if isinstance(batch, dict):
        return model(**batch)
    return model(*batch) if isinstance(batch, tuple) else model(batch)


def trace_forward(model: nn.Module, blocks: list[tuple[str, nn.Module]], run: Any,
                  sdpa: Any = None) -> tuple[Trace, Any]:
    """Run ``run()`` (a forward of ``model``) once, recording ops, params, saved tensors and outputs.

    ``sdpa``: a context manager factory that replaces SDPA while tracing and reports its calls
    (``attention.flash_emulated_sdpa``); None traces whatever SDPA does.
    """
    names = {id(m): n for n, m in model.named_modules()}
    trace = Trace(segments=[EMBEDDING] + [n for n, _ in blocks] + [HEAD])
    state = _State(names)
    param_owner: dict[int, tuple[str, int, int]] = {}
    for n, p in model.named_parameters():
        param_owner.setdefault(_storage_key(p), (n, p.numel(), p.numel() * p.element_size()))
    param_keys = set(param_owner)
    trace.param_storage = set(param_keys)
    attention = sdpa(state.sdpa_event) if sdpa is not None else contextlib.nullcontext()
    with _hooks(model, blocks, trace, state), attention, \
            torch.autograd.graph.saved_tensors_hooks(_pack_hook(trace, state, param_keys, set()), lambda t: t), \
            _Recorder(trace, state, param_owner):
        out = run()
    logits_out = getattr(out, "logits", out)
    if isinstance(logits_out, torch.Tensor):
        trace.output_ids[HEAD] = id(logits_out)
    # parameters no op touched (unused modules) still count, in the head, so totals add up
    for _, numel, nbytes in param_owner.values():
        trace.params[HEAD] += numel
        trace.param_bytes[HEAD] += nbytes
        trace.param_tensors[HEAD] += 1
    logits = getattr(out, "logits", out)
    trace.output_bytes[HEAD] = _tensor_bytes(logits)
    trace.keepalive.append(out)
    return trace, out
