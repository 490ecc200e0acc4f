"""Context parallelism in the planner: the ring's terms against hand formulas, what cp divides and what it
does not, refusals in one line, pinned and searched cp, and plans written before cp existed."""

import dataclasses
import json

import pytest

from autoplan.cli.main import main
from autoplan.cost.analytic_ops import block_ops
from autoplan.cost.comm import group_link
from autoplan.cost.context_parallel import all_gather_time_s, ring_exposed_s
from autoplan.cost.layer_ops import kernel_times, layer_cost
from autoplan.cost.model_states import state_bytes_per_param
from autoplan.cost.workload import LayerSplit
from autoplan.errors import SpecError
from autoplan.schema import ParallelDims, TrainingSetup, load_cluster, load_model, load_plan, load_stack
from autoplan.schema.plan import check_context_parallel, context_parallel_refusal

# llama3-8b at 128k tokens: a sequence one device cannot hold, the case context parallelism is for
S, E = 131072, 2  # tokens, bf16 bytes


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def setup():
    return load_model("llama3-8b"), load_cluster("dgx-h100-80gb"), TrainingSetup(global_batch_size=8, seq_len=S)


@pytest.mark.parametrize(("tp", "cp", "crosses_nodes"), [(2, 4, False), (2, 8, True)])
def test_ring_kv_exchange_matches_the_hand_formula(setup, tp, cp, crosses_nodes):
    """Forward, per block and micro-batch, each rank all-gathers K and V: it holds 2 x (s / cp) x kv / tp
    elements and receives (cp - 1) such shards, on NVLink while tp x cp fits the 8-GPU node and on the
    inter-node link (4 NICs of the CP group per node at tp 2) once it does not."""
    model, cluster, training = setup
    stack = load_stack("megatron")
    ops = block_ops(model, LayerSplit(1, tp, True, cp), training, stack)
    kv_bytes = 2 * (S / cp) * model.kv_size / tp * E  # = 2 x 16384 x 1024 / 2 x 2 at cp 8: 33.5 MB
    assert ops.ring.kv_bytes == kv_bytes
    assert ops.ring.grad_kv_bytes == 2 * kv_bytes  # dK, dV accumulate in fp32
    intra, inter = cluster.intra_node, cluster.inter_node
    if crosses_nodes:
        bandwidth = min(intra.bandwidth_gb_per_s, (8 // tp) * inter.bandwidth_gb_per_s) * 1e9
        latency = inter.latency_us * 1e-6
    else:
        bandwidth, latency = intra.bandwidth_gb_per_s * 1e9, intra.latency_us * 1e-6
    hand = cluster.collective_latency_us * 1e-6 + (cp - 1) * latency + (cp - 1) * kv_bytes / bandwidth
    link = group_link(cluster, ParallelDims(tp=tp, cp=cp).span("cp"))
    assert all_gather_time_s(ops.ring, link) == pytest.approx(hand, rel=1e-12)
    # overlap: only ring step 0's kernel (1/cp of the attention) hides the gather; backward adds the
    # dK/dV ring, each hop hidden by the next step's kernel but the last
    t = kernel_times(ops, cluster, training, stack)
    cost = layer_cost(ops, cluster, training, stack, ParallelDims(tp=tp, cp=cp))
    assert cost.cp_fwd_s == pytest.approx(max(0.0, hand - t.attention_fwd_s / cp), rel=1e-12)
    hop = cluster.collective_latency_us * 1e-6 + latency + 2 * kv_bytes / bandwidth
    step_bwd = t.attention_bwd_s / cp
    bwd = max(0.0, hand - step_bwd) + (cp - 1) * max(0.0, hop - step_bwd) + hop
    assert cost.cp_bwd_s == pytest.approx(bwd, rel=1e-12)
    assert ring_exposed_s(ops.ring, t.attention_fwd_s, t.attention_bwd_s, link) == (cost.cp_fwd_s, cost.cp_bwd_s)


def test_ring_working_memory_counts_on_every_rank(setup):
    """The gathered K/V of the whole sequence and two fp32 dK/dV accumulators, beside the ZeRO-3 buffers;
    the loss's logits on the last rank are not live at the same time (the larger of the two counts)."""
    from autoplan.cost.model_workload import workload_fn
    from autoplan.cost.stage_terms import rank_fixed_dynamic
    from autoplan.cost.tables import build_table
    from tests.planner.random_problems import config

    model, cluster, training = setup
    w = workload_fn(model, cluster, training)(LayerSplit(1, 2, True, 8))
    kv_bytes = 2 * (S / 8) * model.kv_size / 2 * E
    assert w.ring_transient_bytes == 8 * kv_bytes + 2 * 2 * kv_bytes  # 268 MB + 134 MB
    table = build_table(w, cluster, training, config(tp=2, pp=2, dp=1, cp=8, sequence_parallel=True,
                                                      num_microbatches=8))
    assert rank_fixed_dynamic(table, 0) == table.ring_transient_bytes > 0
    assert rank_fixed_dynamic(table, 1) == max(table.ring_transient_bytes, table.logits_transient_bytes)


def test_cp_divides_tokens_activations_and_attention_work_not_parameters(setup):
    """The load-balanced causal split gives each rank 1/cp of every token-linear quantity and exactly
    1/cp of the causal attention pairs (2 c^2 per ring step, cp steps, c = s / 2cp)."""
    model, _, training = setup
    stack = load_stack("megatron")
    whole = block_ops(model, LayerSplit(1, 2, True), training, stack)
    split = block_ops(model, LayerSplit(1, 2, True, 4), training, stack)
    assert split.params == whole.params
    assert split.saved.none == whole.saved.none / 4 and split.saved.full == whole.saved.full / 4
    assert [g.m for g in split.gemms] == [g.m // 4 for g in whole.gemms]
    assert split.attention.flops == whole.attention.flops / 4
    assert split.attention.kernel_seq_len == S // 4
    c = S // 8
    assert 2 * c * c * 4 == S * S / 2 / 4  # the rank's causal pairs: 1/cp of s^2 / 2


def test_gradients_and_zero_shard_over_dp_times_cp(setup):
    _, _, training = setup
    assert state_bytes_per_param(training, 3, 2 * 4, False) == state_bytes_per_param(training, 3, 8, False)
    for zero in (1, 2, 3):
        assert state_bytes_per_param(training, zero, 8, False).total < state_bytes_per_param(training, zero, 2,
                                                                                             False).total


def test_refusals_name_the_reason(setup):
    model, _, training = setup
    assert context_parallel_refusal(1, model, dataclasses.replace(training, seq_len=100)) is None
    assert "divisible by 2 x cp = 8" in context_parallel_refusal(4, model, dataclasses.replace(training, seq_len=100))
    assert "attention: flash" in context_parallel_refusal(2, model, dataclasses.replace(training, attention="standard"))
    assert "dropout 0" in context_parallel_refusal(2, dataclasses.replace(model, dropout=0.1), training)
    with pytest.raises(SpecError, match="^cp: "):
        check_context_parallel(2, dataclasses.replace(model, dropout=0.1), training)


def test_cli_refuses_a_cp_the_sequence_cannot_split_in_one_line(capsys):
    code, out, err = run(capsys, "plan", "llama-tiny", "--cluster", "cpu-local", "--global-batch-size", "8",
                         "--seq-len", "36", "--cp", "4")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err
    assert "--cp: seq_len 36 is not divisible by 2 x cp = 8" in lines[0]


def test_pinned_cp_plans_and_estimate_agrees(tmp_path, capsys):
    path = tmp_path / "plan.yaml"
    code, out, _ = run(capsys, "plan", "llama-tiny", "--cluster", "cpu-local", "--global-batch-size", "8",
                       "--seq-len", "64", "--cp", "2", "--json", "-o", str(path))
    assert code == 0
    data = json.loads(out)
    plan = load_plan(path)
    assert data["cp"] == plan.cp == 2 and plan.tp * plan.cp * plan.pp * plan.dp == 4
    assert plan.predicted.time.cp_comm_s > 0
    args = ["estimate", "llama-tiny", "--cluster", "cpu-local", "--global-batch-size", "8", "--seq-len", "64",
            "--tp", str(plan.tp), "--pp", str(plan.pp), "--cp", "2", "--zero-stage", str(plan.zero_stage),
            "--schedule", plan.schedule, "--micro-batch-size", str(plan.micro_batch_size)]
    if plan.pp == 1 and not any(s.full_recompute or s.selective_recompute for s in plan.stages):
        code, out, _ = run(capsys, *args, "--json")
        assert code == 0 and json.loads(out)["predicted"]["step_time_s"] == pytest.approx(plan.predicted.step_time_s)
    code, out, _ = run(capsys, *args)
    assert code == 0 and "cp ring exchange" in out and " cp2 " in out


def test_plans_written_before_cp_load_with_cp_1(tmp_path, capsys):
    path = tmp_path / "plan.yaml"
    assert run(capsys, "plan", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "8", "-o", str(path))[0] == 0
    text = path.read_text()
    old = "\n".join(line for line in text.splitlines() if not line.startswith("cp:")
                    and not line.strip().startswith("cp_comm_s:")) + "\n"
    assert old != text
    (tmp_path / "old.yaml").write_text(old)
    plan = load_plan(tmp_path / "old.yaml")
    assert plan.cp == 1 and plan.predicted.time.cp_comm_s == 0.0


def test_search_uses_cp_where_the_sequence_fits_no_other_way(capsys):
    """llama3-8b with 512k-token sequences on 16 H100s: without cp nothing fits (the loss alone, 512k x
    128k/8 fp32 logits per TP rank, is 33 GB); the search finds a cp plan."""
    argv = ["plan", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes", "2", "--global-batch-size", "4",
            "--seq-len", "524288"]
    code, _, err = run(capsys, *argv, "--cp", "1")
    assert code == 2 and "no plan fits" in err
    code, out, _ = run(capsys, *argv, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["cp"] > 1 and data["solver"]["status"] == "OPTIMAL"
