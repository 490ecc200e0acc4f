"""Whole gradients under pipelining live from a stage's first gradient-creating backward to its last
(simulate.memory_peaks): the peaks are events over each rank's real action list, hand-computed here for
1F1B, interleaved and a split backward; evaluate.py prices them, the search's fast path
(layout_terms.py) gives the same integers, the bounds stay below the truth, and stacks or layouts without
whole gradients keep the memory they had."""

import dataclasses
import itertools
import random

import pytest

from autoplan.cost.estimate import estimate_layout, layout_of
from autoplan.cost.evaluate import StageShape, evaluate
from autoplan.cost.layout_terms import LayoutTerms
from autoplan.cost.model_workload import workload_fn
from autoplan.cost.simulate import MemoryPeak, inflight_peaks, memory_peaks
from autoplan.cost.stage_table import PERMILLE, Config
from autoplan.cost.stage_terms import rank_states, stage_activations, stage_whole_grads
from autoplan.cost.tables import build_table
from autoplan.cost.workload import LayerSplit
from autoplan.schema import Cluster, Link, ModelSpec, TrainingSetup, load_device, load_stack
from autoplan.schema.schedule import Action, build_schedule
from autoplan.search.bounds import busiest_rank_ns, rank_floors, states_fit
from autoplan.search.recompute import cheapest_recompute, stage_choices
from autoplan.search.space import stage_splits

from .random_problems import random_problem, rank_choices_agree, workload_of

DEVICE = load_device("a100-sxm-80gb")
CLUSTER = Cluster(name="c", device=DEVICE, devices_per_node=8, num_nodes=1, intra_node=Link(100.0, 5.0),
                  inter_node=Link(10.0, 20.0))
MODEL = ModelSpec(name="m", architecture="llama", num_layers=8, hidden_size=512, ffn_hidden_size=2048,
                  num_attention_heads=8, num_kv_heads=8, vocab_size=1024, seq_len=128)
TRAINING = TrainingSetup(global_batch_size=8, seq_len=128, attention="flash")


def peak(counts: dict[int, int], grads: set[int]) -> MemoryPeak:
    return MemoryPeak(counts, frozenset(grads))


def test_1f1b_holds_a_stage_gradients_from_its_first_backward():
    """pp 2, 4 micro-batches. Rank 0: F0 F1 B0 F2 B1 F3 B2 B3 -- after the warm-up's two forwards its
    gradients appear with B0 (one micro-batch left), and the steady state's F2 holds two again, with them.
    Rank 1: F0 B0 F1 ... -- one micro-batch without gradients, then one with."""
    peaks = memory_peaks(build_schedule("1f1b", 2, 1, 4))
    assert peaks[0] == [peak({0: 2}, {0})]
    assert peaks[1] == [peak({1: 1}, {1})]


def test_1f1b_rank_whose_peak_is_its_first_backward():
    """pp 4, 4 micro-batches: rank 0 runs its 4 forwards, then only backwards, so it peaks either at the
    last forward (4 micro-batches, no gradients) or right after its first backward (3, and its whole
    gradients): two candidates, neither dominating."""
    peaks = memory_peaks(build_schedule("1f1b", 4, 1, 4))
    assert peaks[0] == [peak({0: 3}, {0}), peak({0: 4}, set())]
    assert inflight_peaks(build_schedule("1f1b", 4, 1, 4))[0] == [{0: 4}]


def test_interleaved_peaks_by_hand():
    """pp 2, v 2, 4 micro-batches; rank 0 runs F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1
    B2.2 B2.3 B0.2 B0.3 (stage.microbatch). Candidates: after F0.2 (3, 2 | none), after B2.0 (3, 1 | 2),
    after F0.3 (4, 1 | 2), after F2.2 (4, 1 | 2), after B0.0 (3, 1 | 0, 2), after F2.3 (3, 2 | 0, 2): the
    last and (4, 1 | 2) are left, the others dominated."""
    orders = build_schedule("interleaved", 2, 2, 4)
    listed = " ".join(f"{a.kind}{a.stage}.{a.microbatch}" for a in orders[0])
    assert listed == "F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 B2.2 B2.3 B0.2 B0.3"
    assert memory_peaks(orders)[0] == [peak({0: 3, 2: 2}, {0, 2}), peak({0: 4, 2: 1}, {2})]


def test_interleaved_frees_the_later_stage_before_the_earlier_one_starts():
    """8 ranks, 2 stages each, 8 micro-batches (405B's torchtitan layout): every rank reduces and frees its
    second stage's whole gradients before its first stage's exist, so no peak holds both; 1F1B on the same
    ranks holds its one stage's with all but one micro-batch of rank 0's warm-up."""
    for rank, peaks in memory_peaks(build_schedule("interleaved", 8, 2, 8)).items():
        assert all(len(p.whole_grads) <= 1 for p in peaks), rank
    assert peak({0: 7}, {0}) in memory_peaks(build_schedule("1f1b", 8, 1, 8))[0]


def test_an_input_backward_creates_no_gradients():
    """A split backward: ``I`` computes input gradients only, ``W`` the parameters'. F0 F1 I0 I1 W0 W1: two
    micro-batches without gradients after the forwards, one with them after W0 -- had I0 created them, two
    micro-batches with gradients would be a peak."""
    acts = [Action(0, "F", 0), Action(0, "F", 1), Action(0, "I", 0), Action(0, "I", 1), Action(0, "W", 0),
            Action(0, "W", 1)]
    peaks = memory_peaks({0: acts})[0]
    assert len(peaks) == 2 and peak({0: 2}, set()) in peaks and peak({0: 1}, {0}) in peaks


def small_table(schedule: str = "1f1b", pp: int = 4, zero_stage: int = 2, stack: str | None = None, v: int = 1,
                m: int = 4):
    """The table of MODEL on 8 GPUs with ``pp`` ranks (dp the rest), one micro-batch of 1 sequence each."""
    workload = workload_fn(MODEL, CLUSTER, TRAINING, load_stack(stack) if stack else None)(
        LayerSplit(micro_batch_size=1))
    config = Config(tp=1, pp=pp, dp=8 // pp, sequence_parallel=False, zero_stage=zero_stage, offload_optimizer=False,
                    schedule=schedule, virtual_stages=v, micro_batch_size=1, num_microbatches=m)
    return build_table(workload, CLUSTER, TRAINING, config)


def test_the_rank_peaks_where_its_gradients_appear():
    """1F1B, pp 4, 4 micro-batches, ZeRO-2 on the autoplan stack (whole fp32 gradients): a block's whole
    gradients outweigh a micro-batch of its activations, so rank 0 peaks right after its first backward
    with 3 micro-batches and stage 0's whole gradients; the fits test and the total count them without the
    allocator's reserve, like the model states."""
    t = small_table()
    block_params = workload_fn(MODEL, CLUSTER, TRAINING)(LayerSplit(micro_batch_size=1)).block.params
    assert t.block_grad_bytes == round(4 * block_params) and t.block_grad_bytes > t.block_act_bytes
    shapes = tuple(StageShape(2) for _ in range(4))
    memory = evaluate(t, shapes).memory[0]
    values = {("n", s): 2 for s in range(4)} | {("sel", s): 0 for s in range(4)} | {("full", s): 0 for s in range(4)}
    per_mb, grads = stage_activations(t, 0).value(values), stage_whole_grads(t, 0).value(values)
    assert grads == 2 * t.block_grad_bytes + t.embedding_grad_bytes
    scale = PERMILLE + t.reserve_permille
    assert PERMILLE * grads + scale * 3 * per_mb > scale * 4 * per_mb  # the first backward's peak is the larger
    assert (memory.activations_bytes, memory.whole_grads_bytes, memory.whole_grad_stages) == (3 * per_mb, grads, (0,))
    assert memory.states_bytes == rank_states(t, 0).value(values)
    assert memory.total_bytes == memory.states_bytes + grads + 3 * per_mb + memory.reserve_bytes + memory.fixed_bytes


def test_interleaved_memory_counts_one_stage_gradients_at_a_time():
    """Interleaved pp 2 v 2 (4 stages of 2 blocks), 4 micro-batches: rank 0's peak is the larger of its two
    candidates, (3 of stage 0, 2 of stage 2, both stages' gradients) and (4 of stage 0, 1 of stage 2, stage
    2's), never both stages' gradients with 4 + 2 micro-batches."""
    t = small_table("interleaved", pp=2, v=2)
    shapes = tuple(StageShape(2) for _ in range(4))
    values = {(k, s): (2 if k == "n" else 0) for s in range(4) for k in ("n", "sel", "full")}
    act = {s: stage_activations(t, s).value(values) for s in (0, 2)}
    grad = {s: stage_whole_grads(t, s).value(values) for s in (0, 2)}
    scale = PERMILLE + t.reserve_permille
    candidates = [(PERMILLE * (grad[0] + grad[2]) + scale * (3 * act[0] + 2 * act[2]), 3 * act[0] + 2 * act[2],
                   grad[0] + grad[2]),
                  (PERMILLE * grad[2] + scale * (4 * act[0] + act[2]), 4 * act[0] + act[2], grad[2])]
    _, acts, grads = max(candidates)
    memory = evaluate(t, shapes).memory[0]
    assert (memory.activations_bytes, memory.whole_grads_bytes) == (acts, grads)


def test_without_whole_gradients_memory_is_the_activation_peaks():
    """ZeRO-1, one stage, or a stack that reduces every micro-batch (Megatron): no whole gradients, and each
    rank's memory is the states plus the largest activation peak (inflight_peaks), as before."""
    for t in (small_table(zero_stage=1), small_table(pp=1), small_table(stack="megatron"),
              small_table("interleaved", pp=2, v=2, zero_stage=3, stack="megatron")):
        assert (t.block_grad_bytes, t.embedding_grad_bytes, t.head_grad_bytes) == (0, 0, 0)
        n = t.num_layers // t.num_stages
        shapes = tuple(StageShape(n) for _ in range(t.num_stages))
        values = {(k, s): (n if k == "n" else 0) for s in range(t.num_stages) for k in ("n", "sel", "full")}
        peaks = inflight_peaks(t.orders)
        for rank, memory in evaluate(t, shapes).memory.items():
            acts = max(sum(c * stage_activations(t, s).value(values) for s, c in vec.items()) for vec in peaks[rank])
            assert (memory.activations_bytes, memory.whole_grads_bytes) == (acts, 0)
            assert memory.states_bytes == rank_states(t, rank).value(values)


def test_the_breakdown_shows_the_whole_gradients_and_sums_to_the_peak():
    """The printed memory breakdown counts the peak's whole gradients among the gradients, and its terms
    still add up to the rank's total."""
    t = small_table()
    workload = workload_fn(MODEL, CLUSTER, TRAINING)
    layout = layout_of(t.config, tuple(StageShape(2) for _ in range(4)))
    predicted, evaluation, _ = estimate_layout(workload, CLUSTER, TRAINING, layout)
    b = predicted.memory
    peak_rank = max(evaluation.memory, key=lambda r: evaluation.memory[r].total_bytes)
    assert evaluation.memory[peak_rank].whole_grads_bytes > 0
    parts = (b.weights_gib + b.gradients_gib + b.optimizer_gib + b.activations_gib + b.buffers_gib + b.reserve_gib
             + b.runtime_gib + b.expert_states_gib)
    assert abs(parts - b.total_gib) < 1e-6
    assert b.gradients_gib * 2**30 >= evaluation.memory[peak_rank].whole_grads_bytes


def fast_path_agrees(t, layouts_per_split: int) -> int:
    """Asserts the fast path's excess equals evaluate.py's PERMILLE x (memory - capacity) on every rank, for
    the first layouts of the table's first stage splits; returns how many layouts it checked."""
    terms = LayoutTerms(t)
    checked = 0
    for split in stage_splits(t.num_layers, t.num_stages, 2)[:3]:
        per_stage = [[StageShape(n, a, b) for a, b in stage_choices(n, None)] for n in split]
        for layout in itertools.islice(itertools.product(*per_stage), layouts_per_split):
            truth = evaluate(t, layout)
            n, sel, full = ([getattr(s, f) for s in layout] for f in ("layers", "selective", "full"))
            for rank in terms.ranks:
                m = truth.memory[rank.rank]
                exact = (PERMILLE * (m.states_bytes + m.whole_grads_bytes + m.baseline_bytes)
                         + (PERMILLE + t.reserve_permille) * (m.activations_bytes + m.fixed_bytes)
                         - PERMILLE * t.capacity_bytes)
                pick = [[x[s] for s in rank.stages] for x in (n, sel, full)]
                assert terms.excess(rank, *pick) == exact
            checked += 1
    return checked


def test_fast_path_equals_evaluate_with_whole_gradients():
    """On random small problems, every layout of the configurations with whole gradients: the fast path's
    excess is evaluate.py's PERMILLE x (memory - capacity), to the byte."""
    rng = random.Random(34)
    checked = 0
    for _ in range(60):
        model, cluster, training, _ = random_problem(rng)
        fn = workload_of(model, cluster, training)
        for pp in (2, 4):
            if cluster.num_devices % pp or model.num_layers < pp:
                continue
            for schedule, v in (("1f1b", 1), ("interleaved", 2), ("zb1p", 1), ("zbv", 2), ("gpipe", 1)):
                if model.num_layers < pp * v:
                    continue
                config = Config(tp=1, pp=pp, dp=cluster.num_devices // pp, sequence_parallel=False,
                                zero_stage=rng.choice([2, 3]), offload_optimizer=False, schedule=schedule,
                                virtual_stages=v, micro_batch_size=1, num_microbatches=rng.choice([pp, 2 * pp]))
                t = build_table(fn(LayerSplit(micro_batch_size=1)), cluster, training, config)
                assert t.block_grad_bytes > 0
                checked += fast_path_agrees(t, layouts_per_split=40)
    assert checked > 200


@pytest.mark.parametrize("stack", [None, "torchtitan"])
def test_bounds_stay_below_the_truth_with_whole_gradients(stack):
    """Where whole gradients count at some peaks only, a bound that counted them always would cut layouts
    that fit: ``states_fit`` and ``rank_floors`` (None: nothing fits that split) hold against the cheapest
    fitting recomputation of every split, on tight devices; on torchtitan with the last stage's kept outputs
    too (m of them beside one micro-batch, at least)."""
    rng = random.Random(35)
    seen = refused = 0
    model = ModelSpec(name="m", architecture="gpt", num_layers=8, hidden_size=256, ffn_hidden_size=1024,
                      num_attention_heads=4, num_kv_heads=4, vocab_size=1024, seq_len=256)
    training = TrainingSetup(global_batch_size=8, seq_len=256, attention="standard")
    for _ in range(40):
        device = dataclasses.replace(DEVICE, memory_gib=rng.uniform(0.03, 0.12))
        cluster = dataclasses.replace(CLUSTER, device=device, devices_per_node=4)
        workload = workload_fn(model, cluster, training, load_stack(stack) if stack else None)(
            LayerSplit(micro_batch_size=1))
        schedule, v = rng.choice([("1f1b", 1), ("interleaved", 2), ("zb1p", 1), ("gpipe", 1)])
        config = Config(tp=1, pp=2, dp=2, sequence_parallel=False, zero_stage=rng.choice([2, 3]),
                        offload_optimizer=False, schedule=schedule, virtual_stages=v, micro_batch_size=1,
                        num_microbatches=rng.choice([2, 4]))
        t = build_table(workload, cluster, training, config)
        terms = LayoutTerms(t)
        any_fits = False
        for split in stage_splits(t.num_layers, t.num_stages, 2):
            chosen = cheapest_recompute(t, split, None, "auto", terms)
            floors = rank_floors(t, split, None)
            if floors is None:
                assert chosen is None, split
                refused += 1
                continue
            if chosen is None:
                continue
            any_fits = True
            seen += 1
            assert evaluate(t, chosen).fits
            step = terms.step_ns(*([getattr(s, f) for s in chosen] for f in ("layers", "selective", "full")))[0]
            assert busiest_rank_ns(t, split, floors) <= step
        assert states_fit(t) or not any_fits
    assert seen >= 20 and refused >= 5


@pytest.mark.parametrize("stack", [None, "torchtitan"])
def test_recompute_solvers_agree_with_whole_gradients(stack):
    """A rank's peaks with whole gradients are several constraints even on one stage (4 micro-batches, or 3
    and the gradients): the closed form equals enumeration there, and CP-SAT equals enumeration on
    interleaved ranks, on devices between what full recomputation everywhere and none need; on torchtitan
    the last rank's peaks also hold its kept outputs, which no recomputation frees."""

    rng = random.Random(36)
    model = ModelSpec(name="m", architecture="gpt", num_layers=16, hidden_size=256, ffn_hidden_size=1024,
                      num_attention_heads=4, num_kv_heads=4, vocab_size=1024, seq_len=512)
    training = TrainingSetup(global_batch_size=8, seq_len=512, attention="standard")
    closed = solved = 0
    for _ in range(30):
        device = dataclasses.replace(DEVICE, memory_gib=rng.uniform(0.05, 0.2))
        cluster = dataclasses.replace(CLUSTER, device=device, devices_per_node=4)
        workload = workload_fn(model, cluster, training, load_stack(stack) if stack else None)(
            LayerSplit(micro_batch_size=1))
        base = dict(tp=1, pp=4, dp=1, sequence_parallel=False, zero_stage=2, offload_optimizer=False,
                    micro_batch_size=1, num_microbatches=4)
        one = build_table(workload, cluster, training, Config(**base, schedule="1f1b", virtual_stages=1))
        terms = LayoutTerms(one)
        assert any(len(rank.peaks) > 1 for rank in terms.ranks)
        closed += rank_choices_agree(terms, lambda: (rng.randint(2, 6),), "auto", "enumerate")
        two = build_table(workload, cluster, training, Config(**base, schedule="interleaved", virtual_stages=2))
        solved += rank_choices_agree(LayoutTerms(two), lambda: (2, 2), "enumerate", "cpsat")
    assert closed >= 5 and solved >= 5


# --- the last stage's outputs a stack keeps until the step ends (StackProfile.pipeline_keeps_outputs) ---


def test_kept_outputs_by_hand_1f1b():
    """pp 2, 4 micro-batches, torch's schedule keeping outputs. Rank 1 (the last stage) runs F0 B0 F1 B1 F2
    B2 F3 B3: after F0 (1 micro-batch, no gradients, 1 output), after B0 (0, its gradients, 1), after F1, F2,
    F3 (1, gradients, 2 / 3 / 4): the last one, after its 4th forward, holds every output and dominates.
    Rank 0 holds no last stage, so nothing changes there; without the flag no peak counts outputs."""
    orders = build_schedule("1f1b", 2, 1, 4)
    peaks = memory_peaks(orders, True)
    assert peaks[1] == [MemoryPeak({1: 1}, frozenset({1}), 4)]
    assert peaks[0] == [peak({0: 2}, {0})]
    assert all(p.kept_outputs == 0 for ps in memory_peaks(orders).values() for p in ps)


def test_kept_outputs_by_hand_interleaved():
    """pp 2, v 2, 4 micro-batches; rank 1 (stages 1 and 3, the last) runs F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2
    B1.0 F1.3 B1.1 F3.2 B3.2 F3.3 B3.3 B1.2 B1.3. Candidates (stage 1, stage 3 | gradients | outputs): after
    F3.0 (2, 1 | - | 1), B3.0 (2, 0 | 3 | 1), F3.1 (2, 1 | 3 | 2), F1.2 (3, 0 | 3 | 2), B1.0 (2, 0 | 1, 3 | 2),
    F1.3 (3, 0 | 1, 3 | 2), F3.2 (2, 1 | 1, 3 | 3), F3.3 (2, 1 | 1, 3 | 4). Left: after F3.3 (every output,
    fewer activations) and after F1.3 (more activations, two outputs)."""
    peaks = memory_peaks(build_schedule("interleaved", 2, 2, 4), True)[1]
    assert peaks == [MemoryPeak({1: 2, 3: 1}, frozenset({1, 3}), 4), MemoryPeak({1: 3}, frozenset({1, 3}), 2)]


def test_kept_output_bytes_are_one_microbatch_of_logits():
    """torchtitan keeps one micro-batch's bf16 logits per last-stage forward (vocabulary over tp); only under
    pipelining; the runtime of this project (return_outputs=False) and Megatron keep none."""
    from autoplan.cost.activations import elem_bytes

    t = small_table(stack="torchtitan")
    e = elem_bytes(TRAINING.activation_precision)
    assert t.kept_output_bytes == 128 * MODEL.padded_vocab_size(1) * e > 0
    assert small_table(pp=1, stack="torchtitan").kept_output_bytes == 0
    for stack in ("autoplan", "megatron"):
        assert small_table(stack=stack).kept_output_bytes == 0


def test_the_last_rank_counts_every_kept_output():
    """1F1B pp 4, 4 micro-batches on torchtitan: the last rank's peak is after its 4th forward, with one
    micro-batch of activations, its whole gradients and 4 outputs (counted among the activations, with their
    reserve); the first rank keeps none. The breakdown's terms still add up to the total."""
    t = small_table(stack="torchtitan")
    shapes = tuple(StageShape(2) for _ in range(4))
    values = {(k, s): (2 if k == "n" else 0) for s in range(4) for k in ("n", "sel", "full")}
    memory = evaluate(t, shapes).memory
    last = memory[3]
    assert last.kept_outputs_bytes == 4 * t.kept_output_bytes
    assert last.activations_bytes == stage_activations(t, 3).value(values) + 4 * t.kept_output_bytes
    assert last.whole_grads_bytes == stage_whole_grads(t, 3).value(values)
    assert memory[0].kept_outputs_bytes == 0
    off = dataclasses.replace(t, kept_output_bytes=0)
    assert evaluate(off, shapes).memory[3].activations_bytes == last.activations_bytes - 4 * t.kept_output_bytes
    workload = workload_fn(MODEL, CLUSTER, TRAINING, load_stack("torchtitan"))
    predicted, evaluation, _ = estimate_layout(workload, CLUSTER, TRAINING, layout_of(t.config, shapes))
    b = predicted.memory
    parts = (b.weights_gib + b.gradients_gib + b.optimizer_gib + b.activations_gib + b.buffers_gib + b.reserve_gib
             + b.runtime_gib + b.expert_states_gib)
    assert abs(parts - b.total_gib) < 1e-6


def test_fast_path_equals_evaluate_with_kept_outputs():
    """As ``test_fast_path_equals_evaluate_with_whole_gradients``, on torchtitan (whole gradients and kept
    outputs) and on a table that keeps outputs without whole gradients (ZeRO-1): the fast path's excess is
    evaluate.py's, to the byte."""
    rng = random.Random(37)
    stack = load_stack("torchtitan")
    checked = 0
    for _ in range(30):
        model, cluster, training, _ = random_problem(rng)
        fn = workload_of(model, cluster, training, stack)
        for pp in (2, 4):
            if cluster.num_devices % pp or model.num_layers < pp:
                continue
            for schedule, v in (("1f1b", 1), ("interleaved", 2), ("zb1p", 1), ("gpipe", 1)):
                if model.num_layers < pp * v:
                    continue
                config = Config(tp=1, pp=pp, dp=cluster.num_devices // pp, sequence_parallel=False,
                                zero_stage=rng.choice([1, 2, 3]), offload_optimizer=False, schedule=schedule,
                                virtual_stages=v, micro_batch_size=1, num_microbatches=rng.choice([pp, 2 * pp]))
                t = build_table(fn(LayerSplit(micro_batch_size=1)), cluster, training, config)
                assert t.kept_output_bytes > 0
                checked += fast_path_agrees(t, layouts_per_split=20)
    assert checked > 100
