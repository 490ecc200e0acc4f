"""From the raw points of ``autoplan calibrate``'s microbenchmarks to profile fields (pure functions, no
torch, so tests can feed synthetic points): every field below is fitted to kernel- or op-level timings
only, never to a training run, and every point is kept as a ``Residual`` against its fitted value.

* GEMMs (kernels.gemm_points): achieved = peak * w / (w + half) over GFLOP per call (fit.fit_matmul with
  no stated peak: ``peak_fp32_tflops`` is the asymptote of one thread, ``matmul_efficiency`` 1.0).
* memory-bound kernels (kernels.elementwise_points): t = bytes / bandwidth over large activations;
  their fixed cost per call is the host op time below (``kernel_overhead_us`` 0: counted once).
* attention (kernels.attention_points): the measured grid itself (``attention_points``).
* host ops (host_overhead.op_chain_points): chains of tiny ops with counted compute ops and views, forward
  and backward; non-negative least squares of time on (compute ops, views) per direction.
* TP modules, optimizer, FSDP2 units, pipeline actions, collectives: differences and slopes as the
  benchmark module docs state.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from autoplan.profiler.hardware.fit import fit_alpha_beta, fit_matmul, ring_factor
from autoplan.schema.cluster import CollectiveFit
from autoplan.schema.hardware import AttentionPoint, MatmulPoint, Residual

US = 1e6


@dataclass(frozen=True)
class DeviceFit:
    """The fitted device fields (names as in schema/hardware.py) and their residuals."""

    fields: dict
    attention_points: tuple[AttentionPoint, ...]
    matmul_points: tuple[MatmulPoint, ...]
    residuals: tuple[Residual, ...]


def _r(field: str, point: str, measured_s: float, fitted_s: float) -> Residual:
    return Residual(field=field, point=point, measured_us=round(float(measured_s) * US, 3), fitted_us=round(float(fitted_s) * US, 3))


def fit_gemms(points: list[MatmulPoint]) -> tuple[dict, list[Residual]]:
    gflop = [2 * p.m * p.n * p.k / 1e9 for p in points]
    fit = fit_matmul(gflop, [p.tflops for p in points], None)
    residuals = []
    for p, w in zip(points, gflop):
        measured = w / (p.tflops * 1e3)
        fitted = (w + fit.half_size_gflop) / (fit.peak_tflops * 1e3)
        residuals.append(_r("peak_fp32_tflops,matmul_half_size_gflop", f"gemm {p.m}x{p.n}x{p.k}", measured, fitted))
    return {"peak_fp32_tflops": fit.peak_tflops, "matmul_efficiency": 1.0,
            "matmul_half_size_gflop": fit.half_size_gflop}, residuals


def fit_elementwise(points: list[dict]) -> tuple[dict, list[Residual]]:
    """Bandwidth = total bytes / total seconds of the large kernels (least squares through 0)."""
    b = np.array([p["bytes"] for p in points], float)
    t = np.array([p["seconds"] for p in points], float)
    bw = float((b @ b) / (b @ t))
    residuals = [_r("memory_bandwidth_gb_per_s", f"gelu {p['numel']} fp32", p["seconds"], p["bytes"] / bw)
                 for p in points]
    return {"memory_bandwidth_gb_per_s": bw / 1e9, "memory_efficiency": 1.0, "kernel_overhead_us": 0.0}, residuals


def attention(points: list[dict]) -> tuple[AttentionPoint, ...]:
    out = []
    for p in points:
        for direction in ("fwd", "bwd"):
            tflops = p[f"{direction}_flops"] / p[f"{direction}_s"] / 1e12
            out.append(AttentionPoint(seq_len=p["seq_len"], head_dim=p["head_dim"], direction=direction,
                                      dtype="fp32", tflops=round(tflops, 7)))
    return tuple(out)


def fit_host_ops(chains: list[dict]) -> tuple[dict, list[Residual]]:
    """Per direction: time = ops * op_us + views * view_us, NNLS over the chains."""
    fields, residuals = {}, []
    for direction, op_field, view_field in (("fwd", "host_op_us", "host_view_op_us"),
                                            ("bwd", "host_backward_op_us", "host_backward_view_op_us")):
        a = np.array([[c[f"{direction}_compute"], c[f"{direction}_views"]] for c in chains], float)
        t = np.array([c[f"{direction}_s"] for c in chains], float)
        (op_s, view_s), _ = nnls(a / t[:, None], np.ones_like(t))  # relative error weighting
        fields[op_field], fields[view_field] = op_s * US, view_s * US
        for c, row, measured in zip(chains, a, t):
            residuals.append(_r(f"{op_field},{view_field}", f"{c['chain']} chain {direction} "
                                f"({int(row[0])} ops, {int(row[1])} views)", measured, row @ (op_s, view_s)))
    return fields, residuals


def fit_tp_modules(tp: dict) -> dict:
    n = tp["modules"]
    return {"tp_module_fwd_us": max(0.0, tp["tp_fwd_s"] - tp["plain_fwd_s"]) / n * US,
            "tp_module_bwd_us": max(0.0, tp["tp_bwd_s"] - tp["plain_bwd_s"]) / n * US}


def fit_optimizer(points: list[dict]) -> tuple[dict, list[Residual]]:
    """Per tensor from the many tiny tensors (their elements negligible), per parameter from the large ones."""
    by = {p["case"]: p for p in points}
    tiny, dtensor, large = by["tiny"], by["tiny-dtensor"], by["large"]
    tensor_s = tiny["seconds"] / tiny["tensors"]
    dtensor_s = dtensor["seconds"] / dtensor["tensors"]
    per_param_s = max(0.0, large["seconds"] - large["tensors"] * tensor_s) / (large["tensors"] * large["numel"])
    residuals = [_r("optimizer_tensor_us,optimizer_ns_per_param", f"optimizer {p['case']} "
                    f"({p['tensors']} x {p['numel']})", p["seconds"],
                    p["tensors"] * ((dtensor_s if p["dtensor"] else tensor_s) + p["numel"] * per_param_s))
                 for p in points]
    return {"optimizer_tensor_us": tensor_s * US, "optimizer_dtensor_us": dtensor_s * US,
            "optimizer_ns_per_param": per_param_s * 1e9}, residuals


def fit_fsdp(fsdp: dict) -> dict:
    """Host work per FSDP2 unit: (sharded - plain) / units less the unit's own collectives (ZeRO-3: one
    all-gather in forward; one all-gather and one reduce-scatter in backward); and the hooks alone, of a
    micro-batch that neither gathers nor reduces (raw points from before that measurement: not split)."""
    n = fsdp["units"]
    fwd = (fsdp["fsdp_fwd_s"] - fsdp["plain_fwd_s"]) / n - fsdp["all_gather_s"]
    bwd = (fsdp["fsdp_bwd_s"] - fsdp["plain_bwd_s"]) / n - fsdp["all_gather_s"] - fsdp["reduce_scatter_s"]
    fields = {"fsdp_unit_fwd_us": max(0.0, fwd) * US, "fsdp_unit_bwd_us": max(0.0, bwd) * US}
    if "hooks_fwd_s" in fsdp:
        hooks_fwd = max(0.0, (fsdp["hooks_fwd_s"] - fsdp["plain_fwd_s"]) / n)
        hooks_bwd = max(0.0, (fsdp["hooks_bwd_s"] - fsdp["plain_bwd_s"]) / n)
        fields["fsdp_hooks_fwd_us"] = min(hooks_fwd * US, fields["fsdp_unit_fwd_us"])
        fields["fsdp_hooks_bwd_us"] = min(hooks_bwd * US, fields["fsdp_unit_bwd_us"])
    return fields


def fit_pipeline(pipe: dict) -> dict:
    """Slope of the two-stage GPipe step per micro-batch, less one layer's forward and backward, is a
    forward and a backward action's host work on the critical path."""
    m0, m1 = pipe["microbatches"]
    slope = (pipe["step_s"][str(m1)] - pipe["step_s"][str(m0)]) / (m1 - m0)
    action = (slope - pipe["layer_fwd_s"] - pipe["layer_bwd_s"]) / 2
    return {"pipeline_action_us": max(0.0, action) * US}


def fit_device(raw: dict) -> DeviceFit:
    """All device fields from one ``calibrate`` raw measurement (see the module doc)."""
    gemms = [MatmulPoint(**p) for p in raw["gemms"]]
    fields, residuals = fit_gemms(gemms)
    for fields_part, res in (fit_elementwise(raw["elementwise"]), fit_host_ops(raw["host"]["chains"]),
                             fit_optimizer(raw["host"]["optimizer"])):
        fields.update(fields_part)
        residuals += res
    fields.update(fit_tp_modules(raw["host"]["tp_modules"]))
    if "fsdp" in raw["distributed"]:
        fields.update(fit_fsdp(raw["distributed"]["fsdp"]))
        fields.update(fit_pipeline(raw["distributed"]["pipeline"]))
    fields["memory_baseline_gib"] = raw["host"]["heap_baseline_bytes"] / 2**30
    return DeviceFit({k: round(float(v), 6) for k, v in fields.items()}, attention(raw["attention"]),
                     tuple(gemms), tuple(residuals))


def fit_collectives(points: list[dict]) -> tuple[tuple[CollectiveFit, ...], tuple[Residual, ...]]:
    """One alpha-beta fit per (collective, group size, ranks running), every point as a residual."""
    groups: dict[tuple[str, int, int], list[dict]] = defaultdict(list)
    for p in points:
        if p["seconds"] > 0:
            groups[(p["collective"], p["group_size"], p["ranks"])].append(p)
    fits, residuals = [], []
    for (kind, n, ranks), ps in sorted(groups.items()):
        ab = fit_alpha_beta(kind, n, [p["bytes"] for p in ps], [p["seconds"] for p in ps])
        fit = CollectiveFit(collective=kind, group_size=n, ranks=ranks, alpha_us=round(ab.alpha_us, 3),
                            busbw_gb_per_s=round(ab.busbw_gb_per_s, 5))
        fits.append(fit)
        for p in ps:
            fitted = fit.alpha_us / US + ring_factor(kind, n) * p["bytes"] / (fit.busbw_gb_per_s * 1e9)
            residuals.append(_r(f"collectives[{kind},n={n},ranks={ranks}]", f"{kind} {p['bytes']} B",
                                p["seconds"], fitted))
    return tuple(fits), tuple(residuals)


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(v: list[float]) -> np.ndarray:
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        vals = np.asarray(v, float)
        for value in set(vals.tolist()):  # ties share their mean rank
            same = vals == value
            r[same] = r[same].mean()
        return r
    rx, ry = ranks(xs), ranks(ys)
    if rx.std() == 0 or ry.std() == 0:
        return 0.0
    return float(np.corrcoef(rx, ry)[0, 1])


def summarize(residuals: tuple[Residual, ...]) -> list[tuple[str, int, float, float]]:
    """(field, points, median |relative residual|, max |relative residual|) per field."""
    by: dict[str, list[float]] = defaultdict(list)
    for r in residuals:
        by[r.field.split("[")[0] if r.field.startswith("collectives") else r.field].append(abs(r.relative))
    return [(f, len(v), float(np.median(v)), float(max(v))) for f, v in by.items()]
