"""Plain-text tables for the terminal: the ranking of plans, one plan, and the cost breakdowns."""

from __future__ import annotations

from autoplan.schema import Layout, Predicted


def layout_label(x: Layout) -> str:
    several = x.schedule == "interleaved" or (x.schedule == "zb1p" and x.virtual_stages > 1)
    sched = f"{x.schedule}(v={x.virtual_stages})" if several else x.schedule
    flags = []
    if x.sequence_parallel:
        flags.append("sp")
    if x.offload_optimizer:
        flags.append("offload")
    extra = f" {'+'.join(flags)}" if flags else ""
    cp = f" cp{x.cp}" if x.cp > 1 else ""
    experts = (f" ep{x.ep}" if x.ep > 1 else "") + (f" etp{x.etp}" if x.etp > 1 else "")
    return (f"tp{x.tp} pp{x.pp} dp{x.dp}{cp}{experts} zero{x.zero_stage} {sched} mbs{x.micro_batch_size}x{x.num_microbatches}"
            f"{extra}")


def recompute_label(x: Layout) -> str:
    full = sum(len(s.full_recompute) for s in x.stages)
    sel = sum(len(s.selective_recompute) for s in x.stages)
    layers = sum(s.num_layers for s in x.stages)
    parts = [f"full {full}/{layers}"] if full else []
    parts += [f"selective {sel}/{layers}"] if sel else []
    return ", ".join(parts) or "none"


def render(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w) for i, (v, w) in enumerate(zip(r, widths)))
    return "\n".join([line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def ranking_table(plans: list[tuple[Layout, Predicted]]) -> str:
    header = ["#", "layout", "recompute", "step s", "tokens/s", "MFU", "peak GiB", "of GiB"]
    rows = [[str(i + 1), layout_label(x), recompute_label(x), f"{p.step_time_s:.3f}", f"{p.tokens_per_s:,.0f}",
             f"{100 * p.mfu:.1f}%", f"{p.peak_memory_gib:.1f}", f"{p.capacity_gib:.1f}"]
            for i, (x, p) in enumerate(plans)]
    return render(rows, header)


def breakdown_table(p: Predicted) -> str:
    t, m = p.time, p.memory
    time_rows = [[k, f"{v:.4f}", f"{100 * v / p.step_time_s:.1f}%"] for k, v in (
        ("compute", t.compute_s), ("recompute", t.recompute_s), ("tp communication", t.tp_comm_s),
        ("pp transfers", t.pp_comm_s), ("zero-3 gathers", t.zero3_gather_s), ("pipeline bubble", t.bubble_s),
        ("dp communication", t.dp_comm_s), ("optimizer step", t.optimizer_s))]
    if t.cp_comm_s > 0:
        time_rows.insert(3, ["cp ring exchange", f"{t.cp_comm_s:.4f}", f"{100 * t.cp_comm_s / p.step_time_s:.1f}%"])
    if t.ep_comm_s > 0:  # MoE: dispatch and combine not hidden behind compute
        time_rows.insert(3, ["ep all-to-all", f"{t.ep_comm_s:.4f}", f"{100 * t.ep_comm_s / p.step_time_s:.1f}%"])
    digits = 2 if m.total_gib >= 1 else 3  # small (CPU) plans: GiB to the MiB
    runtime = [("process baseline", m.runtime_gib)] if m.runtime_gib else []
    experts = [("expert states (w+g+opt)", m.expert_states_gib)] if m.expert_states_gib else []
    mem_rows = [[k, f"{v:.{digits}f}"] for k, v in (
        ("weights", m.weights_gib), ("gradients", m.gradients_gib), ("optimizer state", m.optimizer_gib), *experts,
        ("activations", m.activations_gib), ("buffers", m.buffers_gib), ("fragmentation reserve", m.reserve_gib),
        *runtime, ("total (peak rank)", m.total_gib))]
    if m.reserved_gib > m.total_gib:  # the stack's allocator cache: shown by nvidia-smi, given back under pressure
        mem_rows.append(["reserved by the allocator", f"{m.reserved_gib:.{digits}f}"])
    stages = ", ".join(f"{g:.{digits - 1}f}" for g in p.memory_gib_per_stage)
    return "\n".join([
        f"step {p.step_time_s:.4f} s, {p.tokens_per_s:,.0f} tokens/s, {p.tflops_per_gpu:.1f} TFLOP/s per GPU "
        f"(MFU {100 * p.mfu:.1f}%, with recomputation {p.hardware_tflops_per_gpu:.1f}, HFU {100 * p.hfu:.1f}%)",
        "", render(time_rows, ["time (critical rank)", "seconds", "share"]), "",
        render(mem_rows, ["memory (peak rank)", "GiB"]),
        f"memory per pipeline rank (GiB): {stages}; capacity {p.capacity_gib:.1f} GiB after the margin",
    ])
