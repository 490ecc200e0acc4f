"""The bytes the runtime's eager layers move through memory outside GEMMs and attention kernels, counted.

The cost model's memory-bound term assumes fused kernels (cost/analytic_ops.py: the element-wise ops
between two GEMMs read their inputs once and write their outputs once), which is how Megatron-LM and
torch.compile run a block. The runtime's reference layers (runtime/models/) run eagerly: every norm step,
rotation, activation, residual add and, in backward, every gradient op is its own kernel that reads its
inputs and writes its output. On a CPU host that traffic is most of a small block's non-GEMM time (gpt-tiny
and llama-tiny at micro-batch 8: 2.4 / 6.7 MB forward, 5.1 / 15.0 MB backward, against 2.2 / 2.8 MB fused).

``count_layer_elements`` runs one layer forward and backward under a ``TorchDispatchMode`` and sums, for
every compute op (op_count.py's kinds; GEMMs, attention kernels, views and ``_unsafe_view`` move nothing
here), the sizes of the tensors it reads and writes, sorted by what they scale with under tensor and
sequence parallelism, in elements per token:

* ``hidden``: a [tokens, h] tensor of the residual stream (norms, residual adds), per h; sequence
  parallelism splits it, TP alone does not;
* ``q`` / ``kv``: a tensor of the attention heads (any op with a 4-d or 5-d operand: the heads' views,
  RoPE, the heads' merge), per h and per kv width; TP splits both;
* ``ffn``: the MLP's hidden activations, per ffn width; TP splits it;
* ``vocab``: logits and their log-softmax, per padded vocabulary; TP splits it.

A half-width tensor (RoPE's even and odd channels) counts 0.5. Tensors that do not grow with the tokens
(weights, RoPE tables, scalars) and per-token statistics (a norm's rstd: 1 element per token) are left
out: they are under 2% of the bytes at the shipped shapes. The counts of the shipped architectures are
``autoplan.cost.analytic_ops.EAGER_ELEMENTS`` (the planning path does not import torch);
tests/profiler/test_eager_bytes.py recounts them at other shapes. ``python -m
autoplan.profiler.hardware.eager_bytes`` prints them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autoplan.profiler.hardware.op_count import GEMM_OPS
from autoplan.schema import ModelSpec

CLASSES = ("hidden", "q", "kv", "ffn", "vocab")
_MOVES_NOTHING = frozenset({"_unsafe_view", "empty", "empty_like", "empty_strided"})

# Shapes at which every class has a per-token width no other class has (h 144, h/2 72, kv 48, kv/2 24,
# ffn 200, vocab 256), so that a tensor's class follows from its size
PROBE = ModelSpec(name="eager-probe", architecture="gpt", num_layers=1, hidden_size=144, ffn_hidden_size=200,
                  num_attention_heads=6, num_kv_heads=2, vocab_size=256, seq_len=12)
PROBE_BATCH = 5  # prime to every width: a tensor broadcast over the batch is not a multiple of the tokens


@dataclass
class _Widths:
    tokens: int
    h: int
    kv: int
    ffn: int
    vocab: int

    def classify(self, t: torch.Tensor, heads_op: bool) -> tuple[str, float] | None:
        if t.numel() % self.tokens:
            return None
        w = t.numel() // self.tokens
        if w in (self.h, self.h // 2):
            return ("q" if heads_op else "hidden"), w / self.h
        if w in (self.kv, self.kv // 2):
            return "kv", w / self.kv
        if w == self.ffn:
            return "ffn", 1.0
        if w == self.vocab:
            return "vocab", 1.0
        return None


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in _tensors(y)]
    return []


class _ElementCounter(TorchDispatchMode):
    def __init__(self, widths: _Widths) -> None:
        super().__init__()
        self.widths = widths
        self.elements = dict.fromkeys(CLASSES, 0.0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if (name in GEMM_OPS or "scaled_dot_product" in name or func.is_view or name in _MOVES_NOTHING):
            return out
        tensors = _tensors(args) + _tensors(kwargs or {}) + _tensors(out)
        heads_op = any(t.ndim >= 4 for t in tensors)
        for t in tensors:
            c = self.widths.classify(t, heads_op)
            if c is not None:
                self.elements[c[0]] += c[1]
        return out


def count_elements(fn: Callable[[], object], widths: _Widths) -> dict[str, float]:
    with _ElementCounter(widths) as counter:
        fn()
    return counter.elements


def _layer(spec: ModelSpec, layer: str, seq_len: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The runtime's ``layer`` of ``spec`` as a function of its input (the head includes the loss)."""
    from runtime.build import cross_entropy
    from runtime.models import build_model

    model = build_model(spec, seq_len=seq_len)
    if layer == "embedding":
        return model.embed
    if layer == "block":
        return next(iter(model.blocks.values()))
    targets = torch.zeros(PROBE_BATCH, seq_len, dtype=torch.long)
    return lambda x: cross_entropy(model.head(model.norm(x)), targets)


def count_layer_elements(spec: ModelSpec, layer: str, batch: int = PROBE_BATCH) -> tuple[dict, dict]:
    """(forward, backward) elements per token by class (module doc) of one ``layer`` of ``spec``."""
    s = spec.seq_len
    widths = _Widths(batch * s, spec.hidden_size, spec.kv_size, spec.ffn_hidden_size, spec.padded_vocab_size(1))
    fn = _layer(spec, layer, s)
    if layer == "embedding":
        x = torch.randint(0, spec.vocab_size, (batch, s))
    else:
        x = torch.randn(batch, s, spec.hidden_size, requires_grad=True)
    fwd = count_elements(lambda: fn(x), widths)
    out = fn(x)
    grad = torch.ones_like(out)
    bwd = count_elements(lambda: out.backward(grad), widths)
    return fwd, bwd


def shipped_counts() -> dict[tuple[str, str], tuple[tuple[float, ...], tuple[float, ...]]]:
    """``EAGER_ELEMENTS`` as counted now, for each architecture and layer at the probe shapes."""
    import dataclasses

    table = {}
    for arch in ("gpt", "llama"):
        spec = dataclasses.replace(PROBE, architecture=arch)
        for layer in ("embedding", "block", "head"):
            fwd, bwd = count_layer_elements(spec, layer)
            table[(arch, layer)] = (tuple(fwd[c] for c in CLASSES), tuple(bwd[c] for c in CLASSES))
    return table


if __name__ == "__main__":
    for key, (fwd, bwd) in shipped_counts().items():
        print(f"    {key!r}: ({fwd!r}, {bwd!r}),")
