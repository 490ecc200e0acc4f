"""The simulated step as pictures: the Chrome trace holds exactly the schedule's actions at the simulated
times, the PNG is written at its stated size, and the text timeline has a legend."""

import json
import struct
import sys

import pytest

from autoplan.cli.main import main
from autoplan.schema.schedule import build_schedule
from autoplan.report.chrome_trace import lane_of, simulated_trace
from autoplan.report.simulated import simulate_plan
from autoplan.schema import load_plan
from autoplan.schema.trace import BACKWARD, FORWARD, P2P_THREAD, SCHEDULE_THREAD, check_trace


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """A 1F1B plan over 4 pipeline ranks and an interleaved one (2 stages per rank) that recomputes."""
    tmp = tmp_path_factory.mktemp("plans")
    out = {}
    for name, flags in (("1f1b", ["--pp", "4", "--schedule", "1f1b", "--micro-batch-size", "1"]),
                        ("interleaved", ["--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2",
                                         "--micro-batch-size", "2", "--recompute", "full", "--devices-per-node", "2"])):
        path = tmp / f"{name}.yaml"
        assert main(["estimate", "gpt-tiny", "--cluster", "cpu-local", "--global-batch-size", "8", "--zero-stage", "0",
                     "--tp", "1", *flags, "-o", str(path)]) == 0
        out[name] = load_plan(path)
    return out


@pytest.mark.parametrize("name", ["1f1b", "interleaved"])
def test_trace_slices_are_the_schedule_at_the_simulated_times(plans, name, capsys):
    plan = plans[name]
    sim = simulate_plan(plan)
    trace = json.loads(json.dumps(simulated_trace(sim)))  # what a file holds
    check_trace(trace)
    tl = sim.evaluation.timeline
    simulated = {(a.stage, a.kind, a.microbatch): (tl.start[i] / 1e3, tl.end[i] / 1e3) for i, a in enumerate(tl.actions)}
    orders = build_schedule(plan.schedule, plan.pp, plan.virtual_stages, plan.num_microbatches)
    for rank in range(plan.pp):
        slices = sorted((e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == rank
                         and e["name"] in (FORWARD, BACKWARD)), key=lambda e: e["ts"])
        got = [(e["args"]["stage"], "F" if e["name"] == FORWARD else "B", e["args"]["microbatch"]) for e in slices]
        assert got == [(a.stage, a.kind, a.microbatch) for a in orders[rank]]
        for e, key in zip(slices, got):
            start, end = simulated[key]
            assert e["ts"] == pytest.approx(start, abs=1e-3) and e["dur"] == pytest.approx(end - start, abs=2e-3)
        # the schedule track is covered exactly once up to the step's end: actions, tail, bubbles
        top = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == rank and e["tid"] == SCHEDULE_THREAD
               and e["name"] != "recompute"]
        assert sum(e["dur"] for e in top) == pytest.approx(sim.evaluation.step_ns / 1e3, abs=1e-2 * len(top))
    info = trace["otherData"]["autoplan"]
    assert info["step_time_s"] == pytest.approx(plan.predicted.step_time_s)
    critical = info["ranks"][str(info["critical_rank"])]["terms_s"]
    assert critical["compute"] == pytest.approx(plan.predicted.time.compute_s)
    assert critical["bubble"] == pytest.approx(plan.predicted.time.bubble_s)


def test_recompute_and_transfers_are_drawn(plans):
    plan = plans["interleaved"]
    sim = simulate_plan(plan)
    events = [e for e in simulated_trace(sim)["traceEvents"] if e["ph"] == "X"]
    recompute = [e for e in events if e["name"] == "recompute"]
    assert len(recompute) == plan.num_stages * plan.num_microbatches  # every backward recomputes (full)
    assert all(e["dur"] == pytest.approx(sim.recompute_ns(e["args"]["stage"]) / 1e3, abs=2e-3) for e in recompute)
    p2p = [e for e in events if e["tid"] >= P2P_THREAD]
    # each micro-batch crosses every stage boundary once forward (activation) and once backward (gradient)
    assert len(p2p) == 2 * (plan.num_stages - 1) * plan.num_microbatches
    assert all(e["dur"] == pytest.approx(sim.table.p2p_ns[0] / 1e3, abs=2e-3) for e in p2p)


def test_lanes_never_overlap():
    spans = [(0, 5), (1, 2), (2, 6), (5, 7), (6, 8), (0.5, 9)]
    lanes = lane_of(spans)
    for k in set(lanes):
        mine = sorted(s for s, lane in zip(spans, lanes) if lane == k)
        assert all(a[1] <= b[0] for a, b in zip(mine, mine[1:]))


def test_check_trace_refuses_crossed_slices():
    bad = {"traceEvents": [{"name": "a", "ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": 10},
                           {"name": "b", "ph": "X", "pid": 0, "tid": 0, "ts": 5, "dur": 10}],
           "otherData": {"autoplan": {"format": 1, "ranks": {}}}}
    with pytest.raises(ValueError, match="overlaps"):
        check_trace(bad)


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_show_writes_trace_png_and_a_legend(plans, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from autoplan.report.figures import figure_size_px
    from autoplan.schema import dump_plan

    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(dump_plan(plans["interleaved"]))
    png, trace = tmp_path / "out" / "step.png", tmp_path / "step.json"
    assert main(["show", str(plan_path), "--timeline", "--trace", str(trace), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "legend: F forward, B backward, r backward that recomputes" in out
    check_trace(json.loads(trace.read_text()))
    plan = plans["interleaved"]
    w, h = figure_size_px(simulate_plan(plan))
    assert png_size(png) == (w, h) and w == 1200 and h > 400  # the size show prints, a fixed width
    assert f"({w} x {h} px)" in out
    assert png.stat().st_size > 20_000  # bars, labels and legends, not a blank canvas


def test_png_without_matplotlib_is_one_line_and_status_2(plans, tmp_path, capsys, monkeypatch):
    from autoplan.schema import dump_plan

    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(dump_plan(plans["1f1b"]))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    code = main(["show", str(plan_path), "--png", str(tmp_path / "x.png")])
    out, err = capsys.readouterr()
    assert code == 2 and "--png: needs matplotlib" in err and len(err.strip().splitlines()) == 1
    assert out == "" and not (tmp_path / "x.png").exists()
