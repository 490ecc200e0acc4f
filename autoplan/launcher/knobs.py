"""The training knobs on ``autoplan run``'s command line: learning rate and its schedule, weight decay,
clipping, seed (``KNOBS`` in autoplan/schema/training.py). They override the plan's ``training`` section
for this run, are passed on to every rank (``runtime.launch`` takes the same flags), and are recorded in
the run's metrics (first row) and its checkpoints' manifests. ``--decay-steps`` defaults to the run's
``--steps``: a schedule that decays over the run that is asked for, not over the 1,000 steps a plan file
says by default."""

from __future__ import annotations

import argparse

from autoplan.schema.training import KNOB_FLAGS, knob_argument, knobs_given

HELP = {
    "--lr": "peak learning rate (default: the plan's training.learning_rate)",
    "--min-lr": "learning rate at the end of the decay (default: the plan's)",
    "--warmup-steps": "linear warm-up steps (default: the plan's)",
    "--decay-steps": "steps to the end of the decay (default: the run's --steps)",
    "--lr-schedule": "after warm-up: cosine (default), linear or constant",
    "--weight-decay": "AdamW weight decay on matrices (default: the plan's)",
    "--clip-grad": "gradient-norm clipping threshold, 0 to disable (default: the plan's)",
    "--seed": "seed of initialisation, data order and dropout (default: the plan's)",
}


def add_knob_arguments(p: argparse.ArgumentParser) -> None:
    for flag, name in KNOB_FLAGS.items():
        p.add_argument(flag, help=HELP[flag], **knob_argument(name))


def knobs_of(args: argparse.Namespace, steps: int | None = None) -> dict[str, object]:
    """The knobs given on the command line (field name -> value); ``steps``: the run's steps, which
    ``decay_steps`` defaults to."""
    knobs = knobs_given(args)
    if steps is not None:
        knobs.setdefault("decay_steps", steps)
    return knobs


def knob_arguments(knobs: dict[str, object]) -> list[str]:
    """The flags that pass ``knobs`` on to runtime.launch."""
    flags = {name: flag for flag, name in KNOB_FLAGS.items()}
    out: list[str] = []
    for name, value in knobs.items():
        out += [flags[name], repr(value) if isinstance(value, float) else str(value)]
    return out
