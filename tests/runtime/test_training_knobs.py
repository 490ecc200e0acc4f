"""The training knobs ``autoplan run`` takes on its command line (``--lr``, ``--lr-schedule``, ...): the
learning-rate schedules' values, the override of a plan's training section with a one-line refusal naming
the flag, and where a run records them (the first metrics row, every checkpoint manifest); the plan's
fingerprint ignores them (a run with another learning rate costs the same)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from autoplan.errors import SpecError
from autoplan.schema.fingerprint import plan_fingerprint
from autoplan.schema.training import KNOBS, TrainingSetup, with_knobs
from rt_helpers import make_plan
from runtime.train.manifest import Manifest, manifest_text
from runtime.train.metrics import MetricsLog
from runtime.train.optim import lr_at

BASE = TrainingSetup(global_batch_size=8, seq_len=32, learning_rate=1e-3, min_learning_rate=1e-4, warmup_steps=2,
                     decay_steps=12)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_schedules(schedule):
    t = dataclasses.replace(BASE, lr_schedule=schedule)
    assert [lr_at(s, t) for s in (0, 1)] == pytest.approx([5e-4, 1e-3])  # linear warm-up to the peak
    middle = lr_at(7, t)  # half way through the decay (steps 2 .. 12)
    expected = {"cosine": 1e-4 + 0.5 * (1 + math.cos(math.pi * 0.5)) * 9e-4, "linear": 1e-4 + 0.5 * 9e-4,
                "constant": 1e-3}[schedule]
    assert middle == pytest.approx(expected)
    assert lr_at(12, t) == pytest.approx(1e-3 if schedule == "constant" else 1e-4)
    assert lr_at(500, t) == lr_at(12, t)  # flat after the decay


def test_knobs_override_and_refuse_naming_the_flag():
    t = with_knobs(BASE, {"learning_rate": 2e-3, "seed": 5, "lr_schedule": "linear"})
    assert (t.learning_rate, t.seed, t.lr_schedule, t.global_batch_size) == (2e-3, 5, "linear", 8)
    for knobs, flag in (({"learning_rate": -1.0}, "--lr"), ({"min_learning_rate": 1.0}, "--min-lr"),
                        ({"seed": -3}, "--seed"), ({"decay_steps": 0}, "--decay-steps")):
        with pytest.raises(SpecError) as err:
            with_knobs(BASE, knobs)
        assert str(err.value).startswith(f"{flag}: ") and "\n" not in str(err.value)


def test_fingerprint_ignores_knobs_but_not_the_batch():
    plan = make_plan(tp=2)
    knobbed = dataclasses.replace(plan, training=with_knobs(plan.training, {"learning_rate": 5e-3, "seed": 9}))
    assert plan_fingerprint(knobbed) == plan_fingerprint(plan)
    bigger = dataclasses.replace(plan, training=dataclasses.replace(plan.training, global_batch_size=16))
    assert plan_fingerprint(bigger) != plan_fingerprint(plan)


def test_a_run_records_its_knobs(tmp_path):
    knobs = with_knobs(BASE, {"learning_rate": 2e-3}).knobs()
    assert set(knobs) == set(KNOBS) and knobs["learning_rate"] == 2e-3
    log = MetricsLog(str(tmp_path / "m.jsonl"), None, None, knobs=knobs)
    for step in (1, 2):
        log.record(step, 3.0, 0.1, 256, 0.5, 1e-3, 1.0)
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert rows[0]["knobs"] == knobs and "knobs" not in rows[1]
    text = manifest_text(Manifest(10, "0" * 64, {"tp": 1}, {}, knobs))
    assert json.loads(text)["training"] == knobs


def test_tensorboard_scalars_load_with_tensorboards_reader(tmp_path):
    """``--tensorboard DIR``: rank 0's scalars per step, read back with TensorBoard's own event reader; the lr
    curve is the schedule's."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from runtime.train.tensorboard_log import TensorBoardLog

    t = dataclasses.replace(BASE, warmup_steps=5, decay_steps=20)
    log, board = MetricsLog(None, 0.5, 1.0), TensorBoardLog(tmp_path / "tb")
    for step in range(20):
        board.record(log.record(step + 1, 4.0 - 0.1 * step, 0.25, 256, 0.75, lr_at(step, t), 1.5))
    board.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    lr = [(e.step, e.value) for e in events.Scalars("train/lr")]
    assert [s for s, _ in lr] == list(range(1, 21))
    assert [v for _, v in lr] == pytest.approx([lr_at(s, t) for s in range(20)], rel=1e-6)  # stored as float32
    assert {"train/loss", "perf/tokens_per_s", "perf/predicted_step_time_s", "memory/peak_gib"} <= set(
        events.Tags()["scalars"])
