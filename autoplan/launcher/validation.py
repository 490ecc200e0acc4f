"""``autoplan run --eval-data FILE [--eval-every K] [--eval-sequences N]``: validation during training,
checked before any process starts (the ranks evaluate with runtime/evaluate.py, as ``autoplan eval``)."""

from __future__ import annotations

import argparse

from autoplan.errors import SpecError
from autoplan.schema import Plan
from autoplan.schema.limits import MAX_STEPS
from autoplan.schema.token_file import describe_eval


def check_validation(args: argparse.Namespace, plan: Plan, on_this_host: bool = True) -> None:
    """The three options together; the file (``on_this_host``; an sbatch script's is checked by the ranks on
    the cluster) against the plan's vocabulary, holding the windows asked for (default: one global batch)."""
    data, every, sequences = (getattr(args, name, None) for name in ("eval_data", "eval_every", "eval_sequences"))
    if data is None:
        if every or sequences is not None:
            raise SpecError(f"{'--eval-every' if every else '--eval-sequences'}: needs --eval-data (the validation "
                            "token file)")
        return
    if not 0 <= (every or 0) <= MAX_STEPS:
        raise SpecError(f"--eval-every: {every} must be in [0, {MAX_STEPS:,}] (0: after the last step only)")
    if sequences is not None and sequences < 1:
        raise SpecError(f"--eval-sequences: {sequences} must be at least 1")
    if on_this_host:
        wanted = plan.training.global_batch_size if sequences is None else sequences
        describe_eval(data, plan.model.vocab_size, plan.training.seq_len, wanted, "--eval-data", "--eval-sequences")
