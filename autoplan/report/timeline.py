"""The pipeline drawn in text: one line per pipeline rank, time left to right, forward and backward of each
micro-batch as the simulator placed them (``F`` forward, ``B`` backward, ``I`` and ``W`` the input and
weight halves of a split backward, ``r`` a backward that recomputes, ``.`` idle). What ``autoplan show --timeline`` prints; the picture is the cost model's, not a guess."""

from __future__ import annotations

from autoplan.cost.evaluate import Evaluation


def draw_timeline(evaluation: Evaluation, recomputing_stages: set[int], width: int = 100) -> str:
    tl = evaluation.timeline
    step = max(tl.rank_end.values()) or 1.0
    ranks = sorted(tl.rank_end)
    rows = {r: ["."] * width for r in ranks}
    for i, action in enumerate(tl.actions):
        first = int(tl.start[i] / step * width)
        last = max(first + 1, int(tl.end[i] / step * width))
        mark = action.kind if action.kind in "FW" or action.stage not in recomputing_stages else "r"
        for x in range(first, min(last, width)):
            rows[tl.ranks[i]][x] = mark
    scale = f"0 s{' ' * (width - 12)}{step * 1e-9:8.3f} s"
    split = any(a.kind == "W" for a in tl.actions)
    halves = "I input backward, W weight backward, " if split else ""
    legend = (f"legend: F forward, B backward, {halves}r backward that recomputes, . idle (bubble, or waiting for a "
              f"transfer)\n        one column = {step * 1e-6 / width:.3g} ms; the step ends with the data-parallel "
              f"reduction and the optimizer step (not drawn)")
    return "\n".join([f"rank {r:2d} |{''.join(rows[r])}|" for r in ranks] + [f"        {scale}", legend])
