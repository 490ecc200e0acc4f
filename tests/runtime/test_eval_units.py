"""Evaluation's pieces, in one process: the forward-only schedules (autoplan/schema/schedule.py) that both
the runtime and the cost model take, the windows read in order with a padded last batch, the summed loss
that ignores padding, when --eval-every evaluates and where the figure is recorded, and every bad input
of `autoplan eval` / `autoplan run --eval-data` refused in one line with status 2 before any process starts.
Multi-process numerics: test_eval_layouts.py."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from autoplan.cli.main import main as autoplan
from autoplan.cost.simulate import simulate
from autoplan.schema import dump_plan
from autoplan.schema.schedule import build_schedule, check_forward_only, forward_only_schedule
from rt_helpers import make_plan
from rt_launcher import ROOT

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3), ("zb1p", 1), ("zb1p", 2),
             ("zbv", 2), ("dualpipev", 2)]


def grid():
    for schedule, v in SCHEDULES:
        for pp in (2, 3, 4):
            for m in (1, 2, 3, 4, 6, 8, 12):
                try:
                    build_schedule(schedule, pp, v, m)
                except Exception:  # a micro-batch count the schedule refuses (the plan refuses it too)
                    continue
                yield schedule, v, pp, m


def test_forward_only_lists_are_the_training_forwards_and_lower_without_deadlock():
    """Each rank runs each forward of its stages once, in its training list's order; torch's own lowering
    pass (which adds the sends and receives the runtime runs) schedules every list to the end."""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType, _add_send_recv

    cases = list(grid())
    assert len(cases) > 100
    for schedule, v, pp, m in cases:
        orders = forward_only_schedule(schedule, pp, v, m)
        check_forward_only(orders, schedule, pp, pp * v, m)
        training = build_schedule(schedule, pp, v, m)
        assert all(orders[r] == [a for a in training[r] if a.kind == "F"] for r in range(pp))
        placed = {a.stage: r for r, acts in orders.items() for a in acts}
        lowered = _add_send_recv({r: [_Action(a.stage, _ComputationType.FORWARD, a.microbatch) for a in acts]
                                  for r, acts in orders.items()}, stage_to_rank=placed.__getitem__,
                                 num_stages=pp * v)
        sends = sum(a.computation_type == _ComputationType.SEND_F for acts in lowered.values() for a in acts)
        # a transfer per stage boundary and micro-batch, except where both stages share a rank (the V's tip)
        assert sends == m * sum(placed[s] != placed[s + 1] for s in range(pp * v - 1)), (schedule, v, pp, m)


def test_the_cost_model_simulates_forward_only_lists():
    """One schedule, two users: a forward-only pass of m micro-batches over pp ranks of one stage each takes
    m + pp - 1 forwards on the last rank (the fill), which the simulator finds from the same lists."""
    for schedule in ("gpipe", "1f1b", "zb1p"):
        for pp, m in ((2, 4), (4, 4), (4, 8)):
            timeline = simulate(forward_only_schedule(schedule, pp, 1, m), [1.0] * pp, [2.0] * pp, [0.0] * pp)
            assert max(timeline.rank_end.values()) == pytest.approx(m + pp - 1)
    timeline = simulate(forward_only_schedule("interleaved", 2, 2, 4), [1.0] * 4, [2.0] * 4, [0.0] * 4)
    assert max(timeline.rank_end.values()) == pytest.approx(2 * 4 + 1)  # v * m forwards per rank + 1 of fill


@pytest.fixture(scope="module")
def ids_file(tmp_path_factory):
    """uint16 ids: id = position % 251 (so a row names where it starts), with a sidecar."""
    path = tmp_path_factory.mktemp("tokens") / "ids.bin"
    count = 40 * 8 + 1
    (np.arange(count) % 251).astype("<u2").tofile(path)
    (path.parent / "ids.bin.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": 256, "tokens": count}))
    return path


def test_windows_are_read_in_order_and_the_last_batch_padded(ids_file):
    from runtime.evaluate import IGNORE, EvalWindows

    plan = make_plan(seq_len=8, micro_batch_size=2, num_microbatches=2)  # G = 4
    windows = EvalWindows.open(str(ids_file), plan, 7)
    assert windows.num_batches(4) == 2
    ids = np.arange(40 * 8 + 1) % 251
    for dp in (1, 2, 4):
        for batch in range(2):
            xs, ys = zip(*(windows.replica_rows(batch, 4, dp, r) for r in range(dp)))
            x, y = torch.cat(xs), torch.cat(ys)
            assert x.shape == y.shape == (4, 8)
            for row in range(4):
                w = batch * 4 + row
                if w < 7:  # window w = ids [w*T, (w+1)*T + 1): inputs then next-token targets
                    assert x[row].tolist() == ids[w * 8:w * 8 + 8].tolist()
                    assert y[row].tolist() == ids[w * 8 + 1:w * 8 + 9].tolist()
                else:  # padding past the 7th window: nothing to predict
                    assert (y[row] == IGNORE).all() and (x[row] == 0).all()


def test_summed_loss_ignores_padding_rows():
    from runtime.evaluate import IGNORE, summed_loss

    torch.manual_seed(0)
    logits, targets = torch.randn(3, 5, 11), torch.randint(0, 11, (3, 5))
    padded = targets.clone()
    padded[2] = IGNORE
    summed, count = summed_loss(logits, padded).tolist()
    want = F.cross_entropy(logits[:2].flatten(0, 1).double(), targets[:2].flatten(), reduction="sum")
    assert count == 10 and summed == pytest.approx(float(want), rel=1e-6)


def test_eval_every_runs_every_k_steps_and_after_the_last():
    from runtime.trainer import RunOptions

    def due(**kw):
        opts = RunOptions(7, **kw)
        return [s for s in range(1, 8) if opts.eval_due(s)]

    assert due(eval_data="f", eval_every=3) == [3, 6, 7]
    assert due(eval_data="f", eval_every=7) == [7]
    assert due(eval_data="f") == [7]
    assert due(eval_every=3) == []


def test_eval_loss_is_recorded_in_metrics_and_tensorboard(tmp_path):
    from runtime.train.metrics import MetricsLog

    log = MetricsLog(str(tmp_path / "m.jsonl"), None, None)
    rows = [log.record(s, 4.0, 0.1, 256, 0.5, 1e-3, 1.0, eval_loss=3.5 if s % 2 == 0 else None) for s in (1, 2, 3, 4)]
    on_disk = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r.get("eval_loss") for r in on_disk] == [None, 3.5, None, 3.5] == [r.get("eval_loss") for r in rows]
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from runtime.train.tensorboard_log import TensorBoardLog

    board = TensorBoardLog(tmp_path / "tb")
    for row in rows:
        board.record(row)
    board.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("eval/loss")] == [(2, 3.5), (4, 3.5)]


@pytest.fixture()
def plan_file(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(dump_plan(make_plan()))
    return path


DATA = str(ROOT / "examples" / "shakespeare_bytes.bin")


def refused(capsys, *argv: str) -> str:
    """`autoplan ARGV` exits 2 with exactly one line on stderr (nothing started); returns that line."""
    status = autoplan(list(argv))
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    return err


def test_bad_eval_input_is_one_line(capsys, plan_file, tmp_path):
    plan = str(plan_file)
    assert "--data" in refused(capsys, "eval", plan, "--data", str(tmp_path / "none.bin"), "--sequences", "3")
    assert "--data" in refused(capsys, "eval", plan, "--sequences", "3")  # argparse: required
    assert "--sequences: 0 must be at least 1" in refused(capsys, "eval", plan, "--data", DATA, "--sequences", "0")
    too_many = refused(capsys, "eval", plan, "--data", DATA, "--sequences", "10000000")
    assert "--sequences" in too_many and "ask for at most" in too_many
    both = refused(capsys, "eval", plan, "--data", DATA, "--sequences", "3", "--init-from", str(tmp_path),
                   "--checkpoint-dir", str(tmp_path))
    assert "--checkpoint-dir" in both and "--init-from" in both
    assert "--step" in refused(capsys, "eval", plan, "--data", DATA, "--sequences", "3", "--step", "2")
    assert "no complete checkpoint" in refused(capsys, "eval", plan, "--data", DATA, "--sequences", "3",
                                               "--checkpoint-dir", str(tmp_path))
    assert "no such folder" in refused(capsys, "eval", plan, "--data", DATA, "--sequences", "3",
                                       "--init-from", str(tmp_path / "nope"))
    assert "synthetic" in refused(capsys, "eval", plan, "--data", "synthetic", "--sequences", "3")


def test_bad_validation_options_of_run_are_one_line(capsys, plan_file):
    plan = str(plan_file)
    assert "needs --eval-data" in refused(capsys, "run", plan, "--eval-every", "2", "--print-command")
    many = refused(capsys, "run", plan, "--eval-data", DATA, "--eval-sequences", "10000000", "--print-command")
    assert many.startswith("autoplan run: error: --eval-sequences") and "--eval-data" in many
    assert "--eval-every" in refused(capsys, "run", plan, "--eval-data", DATA, "--eval-every", "-1",
                                     "--print-command")
    assert autoplan(["run", plan, "--eval-data", DATA, "--eval-every", "2", "--print-command"]) == 0
    assert "--eval-data" in capsys.readouterr().out  # passed on to the ranks


def test_the_ranks_refuse_bad_input_in_one_line(plan_file):
    """runtime.eval_launch started directly (as torchrun does): the same checks, one line, status 2."""
    proc = subprocess.run([sys.executable, "-m", "runtime.eval_launch", str(plan_file), "--data", DATA,
                           "--sequences", "0"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    want = "runtime.eval_launch (rank 0): error: --sequences: 0 must be at least 1"
    assert proc.stderr.strip().splitlines() == [want]


def test_eval_launches_its_own_entry_point(capsys, plan_file):
    """`autoplan eval --print-command` checks everything and prints the torchrun line of runtime.eval_launch
    with the plan's world size; a multi-node plan's per-node lines name it too."""
    from autoplan.launcher.commands import Launch, node_lines

    assert autoplan(["eval", str(plan_file), "--data", DATA, "--sequences", "3", "--json", "--print-command"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("torchrun --standalone --nproc-per-node=1 -m runtime.eval_launch ")
    assert line.endswith("--sequences 3 --timeout 300 --json")
    lines = node_lines(Launch("p.yaml", 8, 2, module="runtime.eval_launch", runtime_args=("--sequences", "3")), "h:1")
    assert len(lines) == 2 and all("-m runtime.eval_launch p.yaml --sequences 3" in l for l in lines)
