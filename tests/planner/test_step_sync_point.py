"""The end of a step waits at one all-rank collective, the gradient norm's all-reduce: every rank's
optimizer step starts after the slowest rank's gradient reduction. Worked on gpt-tiny pp2 dp2 GPipe with
one micro-batch per replica, where the last stage ends its pipeline first but has the longer after-sync
work (it holds the head)."""

from autoplan.cli.main import main
from autoplan.cost.stage_terms import rank_after_sync, rank_before_sync
from autoplan.report.chrome_trace import simulated_trace
from autoplan.report.simulated import simulate_plan
from autoplan.schema import load_plan


def test_optimizer_waits_for_the_slowest_rank_to_reduce(tmp_path):
    path = tmp_path / "plan.yaml"
    assert main(["estimate", "gpt-tiny", "--cluster", "cpu-local-calibrated", "--global-batch-size", "16",
                 "--tp", "1", "--pp", "2", "--dp", "2", "--zero-stage", "0", "--schedule", "gpipe",
                 "--micro-batch-size", "8", "-o", str(path)]) == 0
    plan = load_plan(path)
    sim = simulate_plan(plan)
    ev, t = sim.evaluation, sim.table
    before = {r: ev.rank_sync_exposed_ns[r] + rank_before_sync(t, r).value({}) for r in (0, 1)}
    after = {r: rank_after_sync(t, r).value({("n", s): sim.shapes[s].layers for s in range(2)}) for r in (0, 1)}
    # the case at hand: rank 1 (head) ends its pipeline first but has the longer optimizer step
    assert ev.rank_end_ns[1] + before[1] < ev.rank_end_ns[0] + before[0] and after[1] > after[0]
    assert ev.sync_ns == ev.rank_end_ns[0] + before[0]
    assert ev.step_ns == ev.rank_end_ns[0] + before[0] + after[1]
    # summing each rank's own tail alone would miss the wait: the step is longer than any rank's sum
    assert ev.step_ns > max(ev.rank_end_ns[r] + ev.rank_tail_ns[r] for r in (0, 1))
    # the simulated trace draws rank 1 waiting: its optimizer starts at the sync point, not at its own end
    events = simulated_trace(sim)["traceEvents"]
    optimizer = {e["pid"]: e for e in events if e.get("ph") == "X" and e.get("cat") == "optimizer"}
    assert abs(optimizer[1]["ts"] - ev.sync_ns / 1e3) < 1e-2
    assert optimizer[1]["ts"] + optimizer[1]["dur"] <= ev.step_ns / 1e3 + 1e-2
