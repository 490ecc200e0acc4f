"""``autoplan export-hf CHECKPOINT_DIR OUT_DIR [--step N]``: a checkpoint as a Hugging Face model folder.

CHECKPOINT_DIR is a run's ``--checkpoint-dir`` (its newest complete checkpoint, or ``--step N``) or one
``step_N`` folder in it. The model is read from the checkpoint's manifest (COMPLETE records the plan's
model since export-hf exists); an older checkpoint needs ``--plan PLAN``, the plan it was trained with,
whose model must match the manifest's fingerprint. Every file is checked against the manifest's SHA-256
before anything is read. OUT_DIR gets ``config.json`` and ``model.safetensors`` (or 5 GB shards and an
index), written as ``OUT_DIR.tmp`` and renamed; an existing non-empty OUT_DIR is replaced only with
``--force``. The weights are fp32 as trained; ``AutoModelForCausalLM.from_pretrained(OUT_DIR)`` loads them
(runtime/hf/export.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autoplan.errors import SpecError


def register(subparsers) -> None:
    p = subparsers.add_parser("export-hf", help="write a checkpoint's weights as a Hugging Face model folder "
                              "(config.json + safetensors) that transformers loads",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint_dir", metavar="CHECKPOINT_DIR", help="a run's --checkpoint-dir (its newest complete "
                   "checkpoint is exported) or one step_N folder in it")
    p.add_argument("out_dir", metavar="OUT_DIR", help="the folder to write (new, or empty; --force replaces one)")
    p.add_argument("--step", type=int, metavar="N",
                   help="export the checkpoint of step N (default: the newest complete one)")
    p.add_argument("--plan", help="the plan the checkpoint was trained with; needed only for a checkpoint whose "
                   "COMPLETE manifest does not record the model (written before export-hf existed)")
    p.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists and is not empty")
    p.add_argument("--max-shard-size", type=float, default=5.0, metavar="GB",
                   help="largest safetensors file in GB (10^9 bytes) before the weights are split (default 5)")
    p.set_defaults(func=run)


def pick_checkpoint(directory: str, step: int | None) -> tuple[int, Path]:
    """(step, folder) of the checkpoint to export."""
    from runtime.train.manifest import MARKER, complete_checkpoints

    root = Path(directory)
    if not root.is_dir():
        what = "no such folder" if not root.exists() else "not a folder"
        raise SpecError(f"CHECKPOINT_DIR {directory}: {what}; give a run's --checkpoint-dir or a step_N folder in it")
    if (root / MARKER).is_file() and root.name.startswith("step_") and root.name[5:].isdigit():
        own = int(root.name[5:])
        if step is not None and step != own:
            raise SpecError(f"--step {step}: {root} is the checkpoint of step {own}; drop --step or give its parent")
        return own, root
    found = complete_checkpoints(root)
    if not found:
        raise SpecError(f"CHECKPOINT_DIR {directory}: no complete checkpoint (step_N folders with a {MARKER} marker); "
                        "give a run's --checkpoint-dir")
    if step is None:
        return found[0]
    for s, folder in found:
        if s == step:
            return s, folder
    steps = ", ".join(str(s) for s, _ in found[:8]) + (" ..." if len(found) > 8 else "")
    raise SpecError(f"--step {step}: no complete checkpoint of that step in {directory} (it has steps {steps})")


def model_of(folder: Path, plan_path: str | None):
    """The checkpoint's ModelSpec, from its manifest or ``--plan``, and the manifest (None before manifests)."""
    from autoplan.schema import ModelSpec, load_plan
    from autoplan.schema._io import from_dict, to_dict
    from runtime.train.manifest import model_fingerprint, read_manifest

    try:
        manifest = read_manifest(folder)
    except (OSError, ValueError) as err:
        raise SpecError(f"{folder}: its COMPLETE marker is damaged ({err}); export another checkpoint "
                        "(--step)") from None
    plan_spec = load_plan(plan_path).model if plan_path is not None else None
    if manifest is not None and manifest.model is not None:
        if model_fingerprint(manifest.model) != manifest.model_sha256:
            raise SpecError(f"{folder}: the manifest's model does not match its fingerprint (COMPLETE was edited); "
                            "export another checkpoint (--step)")
        spec = from_dict(ModelSpec, manifest.model, "COMPLETE: model")
    elif plan_spec is None:
        why = "its manifest does not record the model" if manifest is not None else "it has no manifest"
        raise SpecError(f"{folder}: {why} (written before export-hf existed); pass --plan PLAN, the plan it was "
                        "trained with")
    else:
        spec = plan_spec
    trained = manifest.model_sha256 if manifest is not None else None
    if plan_spec is not None and trained is not None and model_fingerprint(to_dict(plan_spec)) != trained:
        raise SpecError(f"--plan {plan_path}: its model {plan_spec.name!r} is not the one {folder} was trained with; "
                        "give the plan of that run")
    return spec, manifest


def run(args: argparse.Namespace) -> int:
    from runtime.hf.files import check_output
    from runtime.train.manifest import check_files

    if args.step is not None and args.step < 0:
        raise SpecError(f"--step: {args.step} must be at least 0")
    if not 0 < args.max_shard_size < float("inf"):
        raise SpecError(f"--max-shard-size: {args.max_shard_size} must be a positive number of GB")
    step, folder = pick_checkpoint(args.checkpoint_dir, args.step)
    spec, manifest = model_of(folder, args.plan)
    check_output(args.out_dir, args.force, spec=spec)
    if manifest is not None:
        problem = check_files(folder, manifest, sorted(manifest.files))
        if problem is not None:
            raise SpecError(f"{folder}: damaged ({problem}); export another checkpoint (--step)")
    from runtime.hf.export import export_checkpoint  # torch: only once everything above is fine

    written = export_checkpoint(folder, args.out_dir, spec, args.force, int(args.max_shard_size * 1e9))
    print(f"autoplan export-hf: wrote {args.out_dir} ({', '.join(written)}) from {folder} (step {step}); "
          f"AutoModelForCausalLM.from_pretrained({str(args.out_dir)!r}) loads it")
    return 0
