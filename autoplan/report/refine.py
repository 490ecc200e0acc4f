"""``autoplan calibrate --runs``: the optional whole-run refinement, kept apart from the kernel-level fit.

One parameter only, ``Cluster.collective_wait_factor`` (the measured collectives' alpha inside a training
step against the barrier-synchronised microbenchmark), fitted to measured runs: the runs are split into a
fit half (every other run, in the order given) and a held-out half; the factor minimises the median
|relative error| of step time over the fit half (golden-section search on its logarithm), and the
held-out runs' errors, before and after, say whether it predicts runs it was not fitted on.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass

from autoplan.report.compare import measured_run, read_metrics
from autoplan.report.simulated import simulate_plan
from autoplan.schema import Cluster, Plan, load_plan


@dataclass(frozen=True)
class Refinement:
    factor: float
    fit_runs: tuple[str, ...]
    test_runs: tuple[str, ...]
    fit_error_before: float
    fit_error_after: float
    test_error_before: float | None
    test_error_after: float | None


def _errors(runs: list[tuple[str, Plan, float]], cluster: Cluster, factor: float) -> list[float]:
    c = dataclasses.replace(cluster, collective_wait_factor=factor)
    out = []
    for _, plan, measured in runs:
        p = dataclasses.replace(plan, cluster=dataclasses.replace(c, devices_per_node=plan.cluster.devices_per_node,
                                                                 num_nodes=plan.cluster.num_nodes))
        sim = simulate_plan(p)
        out.append((sim.step_s - measured) / measured)
    return out


def _median_abs(xs: list[float]) -> float:
    return statistics.median(abs(x) for x in xs)


def refine(cluster: Cluster, pairs: list[tuple[str, str]], warmup_steps: int = 2) -> Refinement:
    """``pairs``: (plan file, metrics file) of runs measured on this machine."""
    runs = [(f"{plan}:{metrics}", load_plan(plan), measured_run(read_metrics(metrics), warmup_steps).step_time_s)
            for plan, metrics in pairs]
    fit, test = runs[0::2], runs[1::2]
    lo, hi = math.log(0.25), math.log(20.0)
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = (_median_abs(_errors(fit, cluster, math.exp(x))) for x in (a, b))
    for _ in range(20):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = _median_abs(_errors(fit, cluster, math.exp(a)))
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = _median_abs(_errors(fit, cluster, math.exp(b)))
    factor = round(math.exp((lo + hi) / 2), 4)
    before = cluster.collective_wait_factor
    return Refinement(
        factor=factor, fit_runs=tuple(r[0] for r in fit), test_runs=tuple(r[0] for r in test),
        fit_error_before=_median_abs(_errors(fit, cluster, before)),
        fit_error_after=_median_abs(_errors(fit, cluster, factor)),
        test_error_before=_median_abs(_errors(test, cluster, before)) if test else None,
        test_error_after=_median_abs(_errors(test, cluster, factor)) if test else None)
