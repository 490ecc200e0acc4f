"""Property: every plan the planner writes trains exactly like one process.

Plans come from ``autoplan plan`` itself under random pins (tests/runtime/rt_plans.py: gpt-tiny and
llama-tiny on 2, 4 and 8 gloo ranks, 40 plans, covering tied embeddings x TP x PP x SP, interleaved,
unequal stages, per-stage and selective recomputation, ZeRO 0-3, offload); each runs 3 steps in one
torchrun launch per world size and is compared with the serial run of the same plan (rt_helpers.
serial_run). Also checked per plan: the compute order torch executed on every pipeline rank is the
plan's action list (autoplan.schema.schedule), the one the cost model simulated.

Tolerance: max relative difference <= 1e-5 of losses and gradient norms (fp32 summation order only,
see test_matrix.py). The fast lane runs the first four plans of world 2 and dropout 0.1 under tp2 in
one 2-rank launch.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile
from pathlib import Path

import pytest

from autoplan.schema import dump_plan, load_model, load_plan
from autoplan.schema._io import dump_yaml
from autoplan.schema.schedule import build_schedule
from rt_helpers import as_recorded, make_plan, serial_run
from rt_launcher import job_results
from rt_plans import COUNTS, FAST_COUNT, REQUIRED, REQUIRED_FEATURES, STEPS, draw_plans, features, planner_plan

FOLDER = Path(tempfile.mkdtemp(prefix="autoplan-planner-plans-"))


def max_rel_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@functools.lru_cache(maxsize=None)
def plans(world: int, count: int) -> tuple[Path, ...]:
    folder = FOLDER / f"w{world}_{count}"
    folder.mkdir(parents=True, exist_ok=True)
    return tuple(draw_plans(folder, world, count, seed=world, required=REQUIRED[world]))


@functools.lru_cache(maxsize=None)
def results(world: int, count: int, extra: tuple[tuple[str, str], ...] = ()) -> dict:
    jobs = [{"name": p.name, "plan": str(p), "steps": STEPS} for p in plans(world, count)]
    jobs += [{"name": name, "plan": path, "steps": STEPS} for name, path in extra]
    return job_results(world, jobs, FOLDER / f"w{world}_{count}")


def check(path: Path, got: dict) -> dict:
    """Equal to serial, and the executed order is the plan's; returns the figures for the summary."""
    plan = load_plan(path)
    losses, norms = serial_run(plan, STEPS)
    loss_diff, norm_diff = max_rel_diff(got["losses"], losses), max_rel_diff(got["grad_norms"], norms)
    assert loss_diff <= 1e-5, (path.name, got["losses"], losses)
    assert norm_diff <= 1e-5, (path.name, got["grad_norms"], norms)
    if plan.num_stages > 1:
        expected = {r: as_recorded([str(a) for a in acts]) for r, acts in
                    build_schedule(plan.schedule, plan.pp, plan.virtual_stages, plan.num_microbatches).items()}
        assert {int(r): acts for r, acts in got["orders"].items()} == expected, path.name
    return {"plan": path.name, "loss": loss_diff, "norm": norm_diff, "features": sorted(features(plan))}


def gpt2_vocab_plan(world: int, pins: dict) -> Path:
    """``autoplan plan`` of a gpt-tiny-like spec with GPT-2's 50,257-token vocabulary, which no tp > 1
    divides: the plan pads it (Megatron: to a multiple of 128 x tp) and the runtime builds the padded
    embedding and head, their padded logits masked, so the run must equal the unpadded serial model's."""
    spec = FOLDER / "gpt-tiny-v50257.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(dump_yaml(dataclasses.replace(load_model("gpt-tiny"), name="gpt-tiny-v50257",
                                                        vocab_size=50257)))
    path = FOLDER / f"v50257_w{world}_{'_'.join(f'{k}{v}' for k, v in pins.items())}.yaml"
    plan = planner_plan(path, str(spec), world, pins, learning_rate=1e-2)
    assert plan is not None and plan.tp == pins["tp"]
    assert plan.model.vocab_size == 50257 and plan.padded_vocab_size == 50257 + (-50257) % (128 * plan.tp)
    return path


VOCAB_FAST = {"tp": 2}  # 2 ranks, one stage: the vocabulary-sharded logits go into loss_parallel
VOCAB_SLOW = ({"tp": 2, "pp": 2}, {"tp": 2, "dp": 2})  # 4 ranks: pipeline (plain logits), and DP


def test_fast_planner_plans_and_dropout_tp2_match_serial():
    dropout_plan = FOLDER / "dropout_tp2.yaml"
    dropout_plan.parent.mkdir(parents=True, exist_ok=True)
    dropout_plan.write_text(dump_plan(make_plan(tp=2, dropout=0.1)))
    vocab_plan = gpt2_vocab_plan(2, VOCAB_FAST)
    got = results(2, FAST_COUNT, (("dropout_tp2", str(dropout_plan)), ("vocab_tp2", str(vocab_plan))))
    for path in plans(2, FAST_COUNT):
        check(path, got[path.name])
    # dropout 0.1 with tp2: masks seeded by element position, so the same as serial (same seed)
    figures = check(dropout_plan, got["dropout_tp2"])
    print(f"dropout 0.1 tp2: max rel diff loss {figures['loss']:.2e}, grad norm {figures['norm']:.2e}")
    figures = check(vocab_plan, got["vocab_tp2"])
    print(f"vocab 50257 padded to {load_plan(vocab_plan).padded_vocab_size}, tp2: max rel diff loss "
          f"{figures['loss']:.2e}, grad norm {figures['norm']:.2e}")


def slow_results(world: int) -> dict:
    """The world's slow launch; world 4 also runs the padded-vocabulary plans (no extra launch)."""
    extra = tuple((p.name, str(p)) for p in (gpt2_vocab_plan(4, pins) for pins in VOCAB_SLOW)) if world == 4 else ()
    return results(world, COUNTS[world], extra)


@pytest.mark.slow
@pytest.mark.parametrize("pins", VOCAB_SLOW, ids=lambda pins: "_".join(f"{k}{v}" for k, v in pins.items()))
def test_gpt2_vocabulary_planned_with_tp2_on_4_ranks_matches_serial(pins):
    path = gpt2_vocab_plan(4, pins)
    figures = check(path, slow_results(4)[path.name])
    print(f"vocab 50257 padded to {load_plan(path).padded_vocab_size}, {pins}, 4 ranks: max rel diff loss "
          f"{figures['loss']:.2e}, grad norm {figures['norm']:.2e}")


SLOW = [pytest.param(world, i, id=f"w{world}-{i:02d}") for world, n in COUNTS.items() for i in range(n)]


@pytest.mark.slow
@pytest.mark.parametrize(("world", "index"), SLOW)
def test_planner_plan_matches_serial(world, index):
    path = plans(world, COUNTS[world])[index]
    figures = check(path, slow_results(world)[path.name])
    summary = FOLDER / "summary.jsonl"
    with summary.open("a") as f:
        f.write(json.dumps(figures) + "\n")
    print(f"{path.name}: {figures}")


@pytest.mark.slow
def test_planner_plans_cover_the_features():
    covered = set().union(*(features(load_plan(p)) for world, n in COUNTS.items() for p in plans(world, n)))
    assert REQUIRED_FEATURES <= covered, REQUIRED_FEATURES - covered
    total = sum(COUNTS.values())
    assert total >= 40
    summary = FOLDER / "summary.jsonl"
    if summary.exists():
        rows = [json.loads(line) for line in summary.read_text().splitlines()]
        print(f"{len(rows)} of {total} planner plans checked; max rel diff loss "
              f"{max(r['loss'] for r in rows):.2e}, grad norm {max(r['norm'] for r in rows):.2e}; "
              f"features: {sorted(covered)}")
