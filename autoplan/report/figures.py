"""``autoplan show --png``: the simulated step drawn, for people who would rather look than read.

Top: a Gantt chart, one row per pipeline rank, of every forward and backward where the simulator placed
it (labelled with the micro-batch, and the stage when a rank holds several), the part of each backward
spent recomputing (hatched), the exposed data-parallel reduction and the optimizer step; grey is idle.
Bottom: memory per pipeline rank stacked by kind against the capacity the planner allows.

Matplotlib is an optional extra (``pip install 'autoplan[viz]'``); it is imported here only, and drawn
through ``matplotlib.figure.Figure`` (no pyplot state, no display needed).
"""

from __future__ import annotations

import io
import os

from autoplan.errors import SpecError
from autoplan.schema._files import write_atomic
from autoplan.report.simulated import SimulatedStep
from autoplan.report.tables import layout_label

WIDTH_IN, DPI = 12.0, 100
COLOURS = {"forward": "#4C72B0", "backward": "#DD8452", "recompute": "#C44E52", "dp reduction": "#55A868",
           "optimizer": "#8172B2"}
IDLE = "#EEEEEE"
MEMORY_KINDS = (("weights", "weights_gib", "#4C72B0"), ("gradients", "gradients_gib", "#DD8452"),
                ("optimizer state", "optimizer_gib", "#8172B2"), ("expert states", "expert_states_gib", "#8C8C3C"),
                ("activations", "activations_gib", "#55A868"),
                ("buffers", "buffers_gib", "#937860"), ("fragmentation reserve", "reserve_gib", "#BBBBBB"),
                ("process baseline", "runtime_gib", "#DA8BC3"))


def figure_size_px(sim: SimulatedStep) -> tuple[int, int]:
    """(width, height) of the PNG: fixed width, 0.45 in per pipeline rank plus room for the memory chart."""
    return int(WIDTH_IN * DPI), int(_height_in(sim.plan.pp) * DPI)


def _height_in(pp: int) -> float:
    return 1.6 + 0.45 * pp + 3.2


def require_matplotlib() -> None:
    """A one-line error (exit 2) before any work when the optional extra is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SpecError("--png: needs matplotlib; install it with pip install 'autoplan[viz]'") from None


def write_png(sim: SimulatedStep, path: str | os.PathLike) -> None:
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    pp = sim.plan.pp
    fig = Figure(figsize=(WIDTH_IN, _height_in(pp)), dpi=DPI)
    gantt_h, memory_h = 0.45 * pp + 0.6, 2.4
    grid = fig.add_gridspec(2, 1, height_ratios=[gantt_h, memory_h], hspace=1.1 / (gantt_h + memory_h) * 2,
                            left=0.08, right=0.80,
                            top=1 - 0.55 / _height_in(pp), bottom=0.5 / _height_in(pp))
    _draw_gantt(fig.add_subplot(grid[0]), sim, Patch)
    _draw_memory(fig.add_subplot(grid[1]), sim, Patch)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # as --trace does
    write_atomic(path, buf.getvalue(), "--png")


def _draw_gantt(ax, sim: SimulatedStep, Patch) -> None:
    tl, pp = sim.evaluation.timeline, sim.plan.pp
    scale, unit = _time_unit(sim.step_s)
    several = sim.plan.virtual_stages > 1
    edge = 0.5 if len(tl.actions) <= 64 * pp else 0.0  # white separators hide hundreds of narrow bars
    for i, a in enumerate(tl.actions):
        row, start, width = tl.ranks[i], tl.start[i] * 1e-9 * scale, (tl.end[i] - tl.start[i]) * 1e-9 * scale
        kind = "forward" if a.kind == "F" else "backward"
        ax.barh(row, width, left=start, height=0.8, color=COLOURS[kind], edgecolor="white", linewidth=edge)
        recompute = sim.recompute_ns(a.stage) * 1e-9 * scale if a.kind in "BI" else 0.0
        if recompute > 0:
            ax.barh(row, recompute, left=start, height=0.8, color=COLOURS["recompute"], hatch="//",
                    edgecolor="white", linewidth=edge)
        if width > sim.step_s * scale / 80:
            label = f"{a.stage}:{a.microbatch}" if several else str(a.microbatch)
            ax.text(start + width / 2, row, label, ha="center", va="center", fontsize=7, color="white")
    for rank in range(pp):
        for term, start_ns, end_ns in sim.tail_slices_ns(rank):
            kind = "dp reduction" if term == "dp_comm" else term
            ax.barh(rank, (end_ns - start_ns) * 1e-9 * scale, left=start_ns * 1e-9 * scale, height=0.8,
                    color=COLOURS[kind], edgecolor="white", linewidth=0.5)
    ax.set_facecolor(IDLE)
    ax.set_yticks(range(pp), [f"rank {r}" for r in range(pp)])
    ax.set_ylim(pp - 0.5, -0.5)
    ax.set_xlim(0, sim.step_s * scale)
    ax.set_xlabel(f"time ({unit})")
    label = "stage:micro-batch" if several else "micro-batch"
    ax.set_title(f"{sim.plan.model.name}: {layout_label(sim.plan)} — simulated step {sim.step_s * scale:.4g} {unit}, "
                 f"bars labelled by {label}", fontsize=10, loc="left")
    ax.legend(handles=[Patch(facecolor=c, label=k, hatch="//" if k == "recompute" else None)
                       for k, c in COLOURS.items()] + [Patch(facecolor=IDLE, edgecolor="grey", label="idle")],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _draw_memory(ax, sim: SimulatedStep, Patch) -> None:
    pp, predicted = sim.plan.pp, sim.predicted
    largest = max(m.total_gib for m in sim.memory_per_rank)
    factor, unit = (1.0, "GiB") if largest >= 1 else (1024.0, "MiB")
    bottoms = [0.0] * pp
    for label, field, colour in MEMORY_KINDS:
        values = [getattr(m, field) * factor for m in sim.memory_per_rank]
        if field == "expert_states_gib" and not any(values):  # a dense model: no bar, no legend entry
            continue
        ax.bar(range(pp), values, bottom=bottoms, color=colour, label=label, width=0.6)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    for r, total in enumerate(bottoms):
        ax.text(r, total, f"{total:.3g}", ha="center", va="bottom", fontsize=8)
    capacity = predicted.capacity_gib * factor
    title = f"memory per pipeline rank ({unit}) against capacity {predicted.capacity_gib:.3g} GiB after the margin"
    if capacity <= 4 * max(bottoms):
        ax.axhline(capacity, color="#C44E52", linestyle="--", linewidth=1.2, label="capacity")
        ax.set_ylim(0, max(capacity, max(bottoms)) * 1.12)
    else:
        title += f" (off scale: peak is {100 * max(bottoms) / capacity:.2g}% of it)"
        ax.set_ylim(0, max(bottoms) * 1.2)
    ax.set_xticks(range(pp), [f"rank {r}" for r in range(pp)])
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=10, loc="left")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _time_unit(step_s: float) -> tuple[float, str]:
    return (1.0, "s") if step_s >= 1 else (1e3, "ms") if step_s >= 1e-3 else (1e6, "us")
