"""What ``autoplan eval`` checks before any process starts -- and every rank of runtime.eval_launch again
before its first collective -- torch-free, each mistake one SpecError line naming the option.

Checked: the token file against the plan's vocabulary (schema/token_file.py ``describe_eval``, as
``autoplan run``'s ``--data``) and that it holds ``--sequences`` windows of seq_len + 1 ids; where the
weights come from -- ``--checkpoint-dir`` (a folder holding a complete checkpoint, ``--step``'s when
given, written for the plan's model: its manifest's model fingerprint), ``--init-from`` (a Hugging Face
folder whose config.json is the plan's model and whose safetensors hold every tensor: runtime/hf/files.py),
or neither (the plan's seeded initial values); and the timeout. Here, in the runtime, because the ranks
run these checks too and the runtime reads only the contract (tests/test_layers.py); the CLI imports it.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from autoplan.errors import SpecError
from autoplan.schema import Plan
from autoplan.schema._io import to_dict
from autoplan.schema.token_file import describe_eval
from runtime.train.manifest import complete_checkpoints, model_fingerprint, read_manifest


def checkpoint_folder(directory: str, step: int | None, plan: Plan) -> Path:
    """The ``step_N`` folder to evaluate: ``step``'s, else the newest complete one; refused when it was
    written for another model than the plan's."""
    root = Path(directory)
    if not root.is_dir():
        raise SpecError(f"--checkpoint-dir {directory}: no such folder")
    found = complete_checkpoints(root)
    if not found:
        raise SpecError(f"--checkpoint-dir {directory}: no complete checkpoint in it (step_N folders with a COMPLETE "
                        "marker, written by autoplan run --checkpoint-every)")
    if step is None:
        folder = found[0][1]
    else:
        folder = next((f for s, f in found if s == step), None)
        if folder is None:
            steps = ", ".join(str(s) for s, _ in sorted(found))
            raise SpecError(f"--step {step}: {directory} has no complete checkpoint step_{step} (its steps: {steps})")
    try:
        manifest = read_manifest(folder)
    except (OSError, ValueError) as err:
        raise SpecError(f"--checkpoint-dir: {folder / 'COMPLETE'} is damaged ({err})") from None
    if manifest is not None and manifest.model_sha256 != model_fingerprint(to_dict(plan.model)):
        raise SpecError(f"--checkpoint-dir: {folder} was written for another model than the plan's "
                        f"{plan.model.name!r}; evaluate it with the plan it was trained with")
    return folder


def check_eval_inputs(args: argparse.Namespace, plan: Plan, notices: list[str] | None = None) -> Path | None:
    """Every option of ``autoplan eval`` / runtime.eval_launch; returns the checkpoint folder (None: the
    weights come from ``--init-from`` or the plan's initialisation). ``notices`` collects one-line notes
    (a token file read as uint16 without a sidecar)."""
    if args.data in ("", "synthetic"):
        raise SpecError("--data: evaluation needs a token file (autoplan prepare-data makes one), not synthetic tokens")
    info = describe_eval(args.data, plan.model.vocab_size, plan.training.seq_len, args.sequences)
    if info.notice is not None and notices is not None:
        notices.append(info.notice)
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise SpecError(f"--timeout: {args.timeout} must be a positive number of seconds")
    if args.step is not None and args.checkpoint_dir is None:
        raise SpecError("--step: needs --checkpoint-dir (the folder whose step_N to evaluate)")
    if args.init_from is not None and args.checkpoint_dir is not None:  # argparse refuses it too
        raise SpecError("--init-from and --checkpoint-dir: give one source of weights")
    if args.init_from is not None:
        from runtime.hf.files import check_init_folder  # torch-free: config.json and safetensors headers

        check_init_folder(args.init_from, plan.model, plan.training.seq_len)
    if args.checkpoint_dir is not None:
        return checkpoint_folder(args.checkpoint_dir, args.step, plan)
    return None
