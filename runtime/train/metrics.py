"""Per-step metrics: one JSON line per step appended to ``--metrics FILE`` by rank 0, and a summary that
sets the measured median step time and peak memory against the plan's prediction.

Relative error: autoplan.schema.trace.relative_error, as in ``autoplan compare``."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from autoplan.schema.fingerprint import FINGERPRINT_KEY
from autoplan.schema.trace import SPEED_PROBE_KEY, host_speed, relative_error


class MetricsLog:
    def __init__(self, path: str | None, predicted_step_s: float | None, predicted_peak_gib: float | None,
                 append: bool = False, calibrated_probes_us: tuple[float, float] = (0.0, 0.0),
                 plan_fingerprint: str | None = None, knobs: dict | None = None) -> None:
        self.path = Path(path) if path else None
        self.plan_fingerprint = plan_fingerprint
        """autoplan.schema.fingerprint of the plan run, written into every row: ``autoplan compare`` refuses
        to set these metrics against another plan."""
        self.knobs = knobs
        """The run's training knobs (learning rate, schedule, seed...), written into the first row it records."""
        self.calibrated_probes_us = calibrated_probes_us
        """The calibration's (GEMM, eager op) probe times (runtime/train/speed_probe.py)."""
        self.predicted_step_s = predicted_step_s
        self.predicted_peak_gib = predicted_peak_gib
        self.rows: list[dict] = []
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not append:  # a fresh run starts a fresh file; a resumed run continues it
                self.path.write_text("")

    def record(self, step: int, loss: float, step_time_s: float, tokens: int, peak_gib: float, lr: float,
               grad_norm: float, peak_gib_per_rank: list[float] | None = None, profiled: bool = False,
               speed_probe: dict[str, float] | None = None, reserved_gib: float | None = None,
               eval_loss: float | None = None) -> dict:
        row = {"step": step, "loss": loss, "step_time_s": round(step_time_s, 6),
               "tokens_per_s": round(tokens / step_time_s, 2) if step_time_s > 0 else None,
               "peak_memory_gib": round(peak_gib, 6), "lr": lr, "grad_norm": grad_norm,
               "predicted_step_time_s": self.predicted_step_s, "predicted_peak_memory_gib": self.predicted_peak_gib}
        if peak_gib_per_rank is not None:
            row["peak_memory_gib_per_rank"] = [round(g, 6) for g in peak_gib_per_rank]
        if reserved_gib is not None:  # CUDA: what the caching allocator held at the peak (this rank)
            row["peak_reserved_gib"] = round(reserved_gib, 6)
        if eval_loss is not None:  # --eval-every: the validation loss after this step (runtime/evaluate.py)
            row["eval_loss"] = eval_loss
        if profiled:
            row["profiled"] = True  # under the profiler: slower than the other steps
        if self.plan_fingerprint is not None:
            row[FINGERPRINT_KEY] = self.plan_fingerprint
        if self.knobs is not None and not self.rows:
            row["knobs"] = self.knobs
        if speed_probe is not None:
            row[SPEED_PROBE_KEY] = {k: round(v, 3) for k, v in speed_probe.items()}
        self.rows.append(row)
        if self.path is not None:
            with self.path.open("a") as f:  # one line per write: a crash leaves whole lines behind
                f.write(json.dumps(row) + "\n")
        return row

    def summary(self) -> str:
        if not self.rows:
            return "no steps run"
        # the first step pays one-off costs (allocations, shape inference), so times skip it when possible;
        # profiled steps are slower (and on CPU their profiler buffers count as heap), so times and the
        # peak leave them out when others remain (as autoplan compare does)
        timed = [r for r in self.rows[1:] if not r.get("profiled")] or self.rows[1:] or self.rows
        t = statistics.median(r["step_time_s"] for r in timed)
        first, last = self.rows[0], self.rows[-1]
        peak = max(r["peak_memory_gib"] for r in [r for r in self.rows if not r.get("profiled")] or self.rows)
        pred = ""
        if self.predicted_step_s is not None:
            pred = (f"; predicted {self.predicted_step_s:.4g} s (error {_pct(relative_error(self.predicted_step_s, t))}), "
                    f"{self.predicted_peak_gib:.4g} GiB (error {_pct(relative_error(self.predicted_peak_gib, peak))})")
        speed = host_speed(*self.calibrated_probes_us, timed)
        if speed is not None:  # the prediction at that speed needs the cost model: autoplan run / compare print it
            pred += f"; host speed against its calibration: kernels {speed.kernel:.2f}x, host work {speed.host:.2f}x"
        return (f"steps {first['step']}-{last['step']}: loss {first['loss']:.4f} -> {last['loss']:.4f}, "
                f"median step {t:.4g} s over {len(timed)} steps, "
                f"{statistics.median(r['tokens_per_s'] or 0 for r in timed):.0f} tokens/s, peak {peak:.4g} GiB{pred}")


def _pct(error: float | None) -> str:
    return "n/a" if error is None else f"{error:+.1%}"
