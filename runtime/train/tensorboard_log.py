"""``--tensorboard DIR``: every step's figures as TensorBoard scalars, written by rank 0 with torch's own
``SummaryWriter`` (torch.utils.tensorboard; the ``tensorboard`` package, which users of TensorBoard have).

One scalar per metrics-row figure, under names TensorBoard groups by prefix: ``train/loss``, ``train/lr``,
``train/grad_norm``, ``perf/tokens_per_s``, ``perf/step_time_s`` beside ``perf/predicted_step_time_s`` (the
plan's prediction, a flat line to read the measured one against), ``memory/peak_gib`` beside
``memory/predicted_peak_gib``, and ``eval/loss`` at the steps validation ran (``--eval-every``). The x axis
is the optimizer step, so a resumed run continues its curves.
"""

from __future__ import annotations

from pathlib import Path

SCALARS = {"loss": "train/loss", "eval_loss": "eval/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
           "tokens_per_s": "perf/tokens_per_s", "step_time_s": "perf/step_time_s",
           "predicted_step_time_s": "perf/predicted_step_time_s", "peak_memory_gib": "memory/peak_gib",
           "predicted_peak_memory_gib": "memory/predicted_peak_gib"}
"""Metrics-row key (runtime/train/metrics.py) -> TensorBoard tag."""


class TensorBoardLog:
    def __init__(self, folder: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package (checked before launch)

        self.writer = SummaryWriter(log_dir=str(folder))

    def record(self, row: dict) -> None:
        for key, tag in SCALARS.items():
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(tag, float(value), global_step=row["step"])
        self.writer.flush()  # a crash keeps every step written so far

    def close(self) -> None:
        self.writer.close()
