"""One paragraph on why the winning plan wins: what it trades against the runner-up."""

from __future__ import annotations

from autoplan.report.tables import layout_label
from autoplan.schema import Layout, Predicted


def why_winner(plans: list[tuple[Layout, Predicted]]) -> str:
    best, p = plans[0]
    t = p.time
    parts = [("compute", t.compute_s), ("recomputation", t.recompute_s), ("TP communication", t.tp_comm_s),
             ("pipeline bubble", t.bubble_s + t.pp_comm_s), ("DP communication", t.dp_comm_s),
             ("ZeRO-3 gathers", t.zero3_gather_s), ("optimizer step", t.optimizer_s),
             ("CP ring exchange", t.cp_comm_s), ("EP all-to-all", t.ep_comm_s)]
    overhead = sorted(parts[1:], key=lambda kv: -kv[1])[:2]
    lines = [f"Why #1: {100 * t.compute_s / p.step_time_s:.0f}% of its step is useful compute; the largest overheads "
             f"are {overhead[0][0]} ({100 * overhead[0][1] / p.step_time_s:.1f}%) and {overhead[1][0]} "
             f"({100 * overhead[1][1] / p.step_time_s:.1f}%); peak memory {p.peak_memory_gib:.1f} of "
             f"{p.capacity_gib:.1f} GiB."]
    if len(plans) > 1:
        second, q = plans[1]
        lines.append(f"The runner-up ({layout_label(second)}) is {100 * (q.step_time_s / p.step_time_s - 1):.1f}% "
                     f"slower: " + term_differences(p, q) + ".")
    return "\n".join(lines)


def schedule_gain(schedule: str, p: Predicted, classic: str, q: Predicted | None) -> str:
    """What a zero-bubble schedule bought the winner: against the best plan with the same parallel sizes,
    micro-batching and stages per rank under the classic schedule ``classic`` (None: nothing fits there)."""
    if q is None:
        return (f"Its schedule, {schedule}, is what makes it fit: with the same sizes under {classic} no layout "
                f"fits in {p.capacity_gib:.1f} GiB.")
    a, b = p.time.bubble_s + p.time.pp_comm_s, q.time.bubble_s + q.time.pp_comm_s
    return (f"Its schedule, {schedule}, against {classic} with the same sizes: pipeline bubble {b:.3f} -> {a:.3f} s, "
            f"recomputation {q.time.recompute_s:.3f} -> {p.time.recompute_s:.3f} s, peak memory "
            f"{q.peak_memory_gib:.1f} -> {p.peak_memory_gib:.1f} GiB; step {q.step_time_s:.3f} -> {p.step_time_s:.3f} s "
            f"({100 * (p.step_time_s / q.step_time_s - 1):+.1f}%).")


def term_differences(a: Predicted, b: Predicted, count: int = 2) -> str:
    """The ``count`` step-time terms where ``b`` spends most more than ``a`` (seconds per step)."""
    ta, tb = a.time, b.time
    diffs = {"compute": tb.compute_s - ta.compute_s, "recomputation": tb.recompute_s - ta.recompute_s,
             "TP communication": tb.tp_comm_s - ta.tp_comm_s,
             "pipeline bubble": (tb.bubble_s + tb.pp_comm_s) - (ta.bubble_s + ta.pp_comm_s),
             "DP communication": tb.dp_comm_s - ta.dp_comm_s, "ZeRO-3 gathers": tb.zero3_gather_s - ta.zero3_gather_s,
             "optimizer step": tb.optimizer_s - ta.optimizer_s, "CP ring exchange": tb.cp_comm_s - ta.cp_comm_s,
             "EP all-to-all": tb.ep_comm_s - ta.ep_comm_s}
    worst = sorted(diffs.items(), key=lambda kv: -kv[1])[:count]
    return ", ".join(f"{k} {'+' if v >= 0 else ''}{v:.3f} s" for k, v in worst)
