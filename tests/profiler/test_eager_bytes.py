"""The cost model's per-layer counts of the runtime's eager work (cost/analytic_ops.py ``HOST_OP_COUNTS``
and ``EAGER_ELEMENTS``) are what the runtime's layers run: recounted here under a ``TorchDispatchMode``,
at the probe shapes the table was counted at and, for the bytes, at the shipped tiny models' shapes, where
the formula's byte total must match every byte the ops touch (tables and statistics included)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autoplan.cost.analytic_ops import EAGER_ELEMENTS, HOST_OP_COUNTS, eager_bytes
from autoplan.profiler.hardware.eager_bytes import CLASSES, PROBE, PROBE_BATCH, _layer, count_layer_elements
from autoplan.profiler.hardware.op_count import count_ops
from autoplan.cost.workload import LayerSplit
from autoplan.schema import TrainingSetup, load_model

LAYERS = ("embedding", "block", "head")


@pytest.mark.parametrize("arch", ["gpt", "llama"])
@pytest.mark.parametrize("layer", LAYERS)
def test_eager_elements_table_is_the_count(arch, layer):
    fwd, bwd = count_layer_elements(dataclasses.replace(PROBE, architecture=arch), layer)
    assert (tuple(fwd[c] for c in CLASSES), tuple(bwd[c] for c in CLASSES)) == EAGER_ELEMENTS[(arch, layer)]


def _input(spec, layer: str, batch: int) -> torch.Tensor:
    if layer == "embedding":
        return torch.randint(0, spec.vocab_size, (batch, spec.seq_len))
    return torch.randn(batch, spec.seq_len, spec.hidden_size, requires_grad=True)


def _activation_bytes(fn, tokens: int) -> int:
    """Every byte of every activation-sized tensor (a multiple of the tokens: weights, RoPE tables and
    scalars are not) a compute op reads or writes, what the class counts leave out (statistics) included."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from autoplan.profiler.hardware.eager_bytes import _MOVES_NOTHING, _tensors
    from autoplan.profiler.hardware.op_count import GEMM_OPS

    class Bytes(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if not (name in GEMM_OPS or "scaled_dot_product" in name or func.is_view or name in _MOVES_NOTHING):
                Bytes.total += sum(t.numel() * t.element_size()
                                   for t in _tensors(args) + _tensors(kwargs or {}) + _tensors(out)
                                   if t.numel() % tokens == 0)
            return out

    with Bytes():
        fn()
    return Bytes.total


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
@pytest.mark.parametrize("layer", LAYERS)
def test_eager_bytes_formula_matches_the_runtime_layers(name, layer):
    """At shapes other than the probe's (h 64, 8 heads, sequence 64), forward and backward: within 4% of
    every activation byte touched; what the formula leaves out (per-token norm statistics, token ids) is the
    rest."""
    spec = load_model(name)
    tokens = PROBE_BATCH * spec.seq_len
    fn = _layer(spec, layer, spec.seq_len)
    x = _input(spec, layer, PROBE_BATCH)
    fwd = _activation_bytes(lambda: fn(x), tokens)
    out = fn(x)
    grad = torch.ones_like(out)
    bwd = _activation_bytes(lambda: out.backward(grad), tokens)
    want_fwd, want_bwd = eager_bytes(spec, layer, LayerSplit(PROBE_BATCH), TrainingSetup(PROBE_BATCH, spec.seq_len, precision="fp32"))
    assert want_fwd == pytest.approx(fwd, rel=0.04)
    assert want_bwd == pytest.approx(bwd, rel=0.04)
    assert want_fwd <= fwd and want_bwd <= bwd  # leaves things out, never invents them


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny"])
@pytest.mark.parametrize("layer", LAYERS)
def test_host_op_counts_are_the_runtime_layers(name, layer):
    spec = load_model(name)
    fn = _layer(spec, layer, spec.seq_len)
    x = _input(spec, layer, PROBE_BATCH)
    fwd, out, _ = count_ops(lambda: fn(x))
    grad = torch.ones_like(out)
    bwd, _, _ = count_ops(lambda: out.backward(grad))
    counted = (fwd.compute, fwd.views, bwd.compute, bwd.views)
    table = HOST_OP_COUNTS[(spec.architecture, layer)]
    if layer == "head":  # the table's head backward was counted inside a whole (tied) model: forward only here
        assert counted[:2] == table[:2]
    else:
        assert counted == table


def test_loss_counts_are_the_runtime_loss():
    """The loss every head adds (analytic_ops.LOSS_HOST_OPS, LOSS_EAGER_ELEMENTS): the runtime's cross-entropy
    on a vocabulary's logits, counted alone, forward and backward (its implicit unit gradient included)."""
    from autoplan.cost.analytic_ops import LOSS_EAGER_ELEMENTS, LOSS_HOST_OPS
    from autoplan.profiler.hardware.eager_bytes import _Widths, count_elements
    from runtime.build import cross_entropy

    s, vocab = PROBE.seq_len, PROBE.padded_vocab_size(1)
    logits = torch.randn(PROBE_BATCH, s, vocab, requires_grad=True)
    targets = torch.zeros(PROBE_BATCH, s, dtype=torch.long)
    fwd, loss, _ = count_ops(lambda: cross_entropy(logits, targets))
    bwd, _, _ = count_ops(lambda: loss.backward())
    assert (fwd.compute, fwd.views, bwd.compute, bwd.views) == LOSS_HOST_OPS
    widths = _Widths(PROBE_BATCH * s, PROBE.hidden_size, PROBE.kv_size, PROBE.ffn_hidden_size, vocab)
    logits.grad = None  # a second backward would add into the first one's gradient
    loss = cross_entropy(logits, targets)
    forward = count_elements(lambda: cross_entropy(logits, targets), widths)
    backward = count_elements(lambda: loss.backward(), widths)
    assert (forward["vocab"], backward["vocab"]) == LOSS_EAGER_ELEMENTS
    assert all(forward[c] == backward[c] == 0 for c in CLASSES if c != "vocab")
