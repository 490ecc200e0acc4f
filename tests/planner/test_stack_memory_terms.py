"""Stack-level memory terms: the fp32 logit copies a stack's loss holds at its peak
(``StackProfile.loss_logit_copies``, ``loss_parallel_logit_copies``), measured on CPU against what the
cost model counts, and a stack that repeats K and V to every query head before attention
(``attention_repeats_kv``: torchtitan), whose kernel keeps and whose ring carries heads / kv_heads x the
grouped bytes."""

import dataclasses
import json

import pytest

from autoplan.cost import activations as act
from autoplan.cost.activations import elem_bytes
from autoplan.cost.analytic_ops import block_ops
from autoplan.cost.context_parallel import ring_exchange, with_repeated_kv
from autoplan.cost.model_workload import workload_fn
from autoplan.cost.workload import LayerSplit
from autoplan.schema import TrainingSetup, load_cluster, load_model, load_stack

SHIPPED = ("autoplan", "torchtitan", "torchtitan-compile", "torchtitan-compile-async-tp", "megatron", "megatron-lm")
TOKENS, VOCAB, HIDDEN = 1024, 4096, 8  # a tiny hidden size: the weight's and hidden state's gradients are negligible


def peak_bytes_per_logit(step, tmp_path) -> float:
    """The most bytes ``step`` holds at once beyond what existed before it, from the CPU allocator's events
    (torch.profiler's memory records, summed in time order), per logit."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = sorted((e for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "[memory]"),
                    key=lambda e: float(e["ts"]))
    live = peak = 0
    for e in events:
        live += e["args"]["Bytes"]
        peak = max(peak, live)
    return peak / (TOKENS * VOCAB)


def loss_step(loss_fn, weight, hidden, targets):
    """The head's projection to bf16 logits, the loss on them, its backward (the logits are referenced only
    by the graph, as in torchtitan's train.py, which deletes ``pred`` before backward, and the runtime's
    trainer, which never names them)."""
    def step():
        loss_fn(hidden @ weight.t(), targets).backward()
    return step


def bf16_inputs():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    hidden = torch.randn(1, TOKENS, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(VOCAB, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    return weight, hidden, torch.randint(0, VOCAB, (1, TOKENS))


def counted_peak(copies: int, e: int) -> float:
    """What the cost model counts at the loss's peak, per logit: the kept fp32 log-softmax (the head's saved
    bytes) and the transient."""
    return 4.0 + act.loss_transient_bytes_per_logit(e, copies)


def test_the_runtimes_loss_peaks_as_its_stack_counts(tmp_path):
    """runtime/build.py ``cross_entropy`` (torchtitan's loss_fn too): 12 bytes a bf16 logit, the kept
    log-softmax and the two gradients its backward builds beside it; the old count (4 + e) missed 2."""
    from runtime.build import cross_entropy

    weight, hidden, targets = bf16_inputs()
    loss_step(cross_entropy, weight, hidden, targets)()  # warm up (lazy initialisation)
    measured = peak_bytes_per_logit(loss_step(cross_entropy, weight, hidden, targets), tmp_path)
    for name in ("autoplan", "torchtitan"):
        assert measured == pytest.approx(counted_peak(load_stack(name).loss_logit_copies, 2), abs=0.02), name
    assert measured == pytest.approx(12.0, abs=0.02)


def test_loss_parallel_peaks_as_its_stack_counts(tmp_path):
    """torch's ``loss_parallel`` on a vocabulary-sharded DTensor (one rank: per rank the same ops on its
    shard): its backward ``(zeros + exp(x)) * grad`` beside the kept log-softmax, 16 bytes a logit."""
    pytest.importorskip("torch")
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        mesh = init_device_mesh("cpu", (1,))
        weight, hidden, targets = bf16_inputs()
        w = distribute_tensor(weight.detach(), mesh, [Shard(0)]).requires_grad_()
        x = distribute_tensor(hidden.detach(), mesh, [Replicate()]).requires_grad_()

        def step():  # torchtitan's train step under utils.get_train_context
            with loss_parallel():
                F.cross_entropy((x @ w.t()).flatten(0, 1).float(), targets.flatten(0, 1)).backward()

        step()
        measured = peak_bytes_per_logit(step, tmp_path)
    finally:
        dist.destroy_process_group()
    for name in ("autoplan", "torchtitan-compile-async-tp"):
        copies = load_stack(name).loss_parallel_logit_copies
        assert measured == pytest.approx(counted_peak(copies, 2), abs=0.02), name
    assert measured == pytest.approx(16.0, abs=0.02)


@pytest.mark.parametrize(("copies", "e", "per_logit"), [
    (3, 2, 8.0),  # torch's cross-entropy on bf16 logits: 12 at the peak less the kept 4
    (4, 2, 12.0),  # loss_parallel
    (1, 2, 2.0),  # Megatron: the fp32 copy becomes the softmax in place; the bf16 cast beside it
    (3, 4, 8.0),  # fp32 activations: .float() copies nothing, the backward's two gradients remain
    (1, 4, 4.0),
])
def test_logits_transient_formula(copies, e, per_logit):
    tokens, tp, vocab = 8192, 4, 128256
    assert act.logits_transient_bytes(tokens, tp, e, vocab, copies) == per_logit * tokens * vocab / tp


def test_the_workload_prices_the_stacks_loss_by_tp():
    """Whole logits at tp = 1, the vocabulary-parallel count under TP, divided by cp like every token count."""
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100-80gb")
    training = TrainingSetup(global_batch_size=8, seq_len=8192)
    for name in SHIPPED[:5]:
        stack = load_stack(name)
        fn = workload_fn(model, cluster, training, stack)
        for tp, cp in ((1, 1), (4, 1), (2, 2)):
            w = fn(LayerSplit(2, tp, tp > 1, cp))
            copies = stack.loss_parallel_logit_copies if tp > 1 else stack.loss_logit_copies
            hand = act.logits_transient_bytes(2 * 8192, tp, 2, model.padded_vocab_size(tp), copies) / cp
            assert w.logits_transient_bytes == pytest.approx(hand, rel=1e-12), (name, tp, cp)
    # the torch loss holds more than Megatron's in-place one, and loss_parallel more than the whole-logit loss
    torch_stack, megatron = load_stack("torchtitan"), load_stack("megatron")
    assert torch_stack.loss_parallel_logit_copies > torch_stack.loss_logit_copies > megatron.loss_logit_copies


def test_the_workload_prices_the_kept_outputs():
    """A stack keeping the last stage's outputs (torchtitan: torch's ``output_chunks``) keeps one micro-batch's
    bf16 logits, vocabulary-sharded under TP (loss parallel), over s / cp tokens; the others none."""
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100-80gb")
    training = TrainingSetup(global_batch_size=8, seq_len=8192)
    for name in SHIPPED:
        stack = load_stack(name)
        fn = workload_fn(model, cluster, training, stack)
        for tp, cp in ((1, 1), (4, 1), (2, 2)):
            w = fn(LayerSplit(2, tp, tp > 1, cp))
            hand = 2 * 2 * 8192 * model.padded_vocab_size(tp) / tp / cp if stack.pipeline_keeps_outputs else 0.0
            assert w.kept_output_bytes == pytest.approx(hand, rel=1e-12), (name, tp, cp)
    assert load_stack("torchtitan").pipeline_keeps_outputs and not load_stack("autoplan").pipeline_keeps_outputs


def test_repeated_kv_widens_the_ring_by_heads_over_kv_heads():
    ring = ring_exchange(4, 1000.0, 500.0, 2)
    wide = with_repeated_kv(ring, 8)
    assert wide == ring_exchange(4, 1000.0, 4000.0, 2)
    assert wide.kv_bytes == 8 * ring.kv_bytes and wide.grad_kv_bytes == 8 * ring.grad_kv_bytes
    assert wide.transient_bytes == 8 * ring.transient_bytes
    assert with_repeated_kv(ring, 1) is ring


@pytest.mark.parametrize("cp", [1, 8])
def test_a_stack_that_repeats_kv_keeps_and_exchanges_the_repeated_heads(cp):
    """Llama 3 405B at tp 8 (16 query heads and 1 K/V head a rank): torchtitan's ``repeat_kv`` makes the
    kernel keep 16 K and V heads instead of one, and the ring gather, hold and return 16x the K/V bytes."""
    model = load_model("llama3-405b")
    cluster = load_cluster("dgx-h100-80gb")
    training = TrainingSetup(global_batch_size=8, seq_len=32768 * cp)
    split = LayerSplit(1, 8, True, cp)
    grouped = load_stack("torchtitan-compile-async-tp")
    assert grouped.attention_repeats_kv
    plain = dataclasses.replace(grouped, attention_repeats_kv=False)
    wide = workload_fn(model, cluster, training, grouped)(split)
    narrow = workload_fn(model, cluster, training, plain)(split)
    e, local = elem_bytes(training.activation_precision), 32768
    # the kernel's K and V: q wide instead of kv wide, on this rank's tokens
    extra = 2 * e * local * (model.q_size - model.kv_size) / 8
    assert wide.block.saved_bytes - narrow.block.saved_bytes == pytest.approx(extra, rel=1e-12)
    assert wide.block.full_saved_bytes == narrow.block.full_saved_bytes
    if cp == 1:
        assert wide.ring_transient_bytes == narrow.ring_transient_bytes == 0
        return
    repeats = model.num_attention_heads // model.num_kv_heads
    assert repeats == 16
    assert wide.ring_transient_bytes == pytest.approx(repeats * narrow.ring_transient_bytes, rel=1e-12)
    kv_elements = 2 * local * model.q_size / 8
    assert wide.ring_transient_bytes == pytest.approx(cp * e * kv_elements + 2 * 4 * kv_elements, rel=1e-12)
    # the gather and the dK/dV ring carry 16x the bytes: more of them is exposed
    assert wide.block.cp_fwd_s + wide.block.cp_bwd_s > narrow.block.cp_fwd_s + narrow.block.cp_bwd_s


def test_the_runtime_and_megatron_pass_kv_grouped():
    """This runtime's SDPA (enable_gqa) and ring carry the kv heads; so do Megatron's TE kernels."""
    model, training = load_model("llama3-8b"), TrainingSetup(global_batch_size=8, seq_len=65536)
    for name in ("autoplan", "megatron", "megatron-lm"):
        stack = load_stack(name)
        assert not stack.attention_repeats_kv
        w = workload_fn(model, load_cluster("dgx-h100-80gb"), training, stack)(LayerSplit(1, 2, True, 4))
        assert w.block.saved_bytes == block_ops(model, LayerSplit(1, 2, True, 4), training, stack).saved.none


def test_every_shipped_stack_names_the_sources_of_its_loss_and_kv_fields():
    for name in SHIPPED:
        stack = load_stack(name)
        sourced = {s.field for s in stack.sources}
        for field in ("loss_logit_copies", "loss_parallel_logit_copies", "attention_repeats_kv"):
            assert field in sourced, (name, field)
