"""Checkpoint integrity across ranks: checksums written with the COMPLETE marker, verified before a resume,
with a fall back to the previous complete checkpoint when the newest one is damaged.

Both directions split the files over the ranks (file i is hashed by rank i % world), so a large
checkpoint costs each rank 1/world of the hashing; DCP itself has no checksums. The folder must be on a
file system every rank sees, which DCP's FileSystemWriter needs anyway.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch.distributed as dist

from autoplan.errors import SpecError
from autoplan.schema import Plan
from autoplan.schema._io import to_dict, write_atomic
from runtime.train.manifest import (
    MARKER, Manifest, check_files, complete_checkpoints, file_digest, manifest_text, model_fingerprint, read_manifest,
)


def _layout(plan: Plan) -> dict:
    return {**plan.dims.as_dict(), "zero_stage": plan.zero_stage, "virtual_stages": plan.virtual_stages,
            "world_size": plan.world_size}


def _share(names: list[str]) -> list[str]:
    return names[dist.get_rank()::dist.get_world_size()]


def _broadcast(obj):
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def write_complete(folder: Path, step: int, plan: Plan) -> None:
    """Collective, after every rank has written its files into ``folder``: hash them in parallel and let
    rank 0 write COMPLETE (atomically) with the manifest."""
    names = _broadcast(sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != MARKER)
                       if dist.get_rank() == 0 else None)
    mine = {name: file_digest(folder / name) for name in _share(names)}
    shares = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, shares, dst=0)
    if dist.get_rank() == 0:
        files = {name: digest for share in shares for name, digest in share.items()}
        model = to_dict(plan.model)
        manifest = Manifest(step, model_fingerprint(model), _layout(plan), files, plan.training.knobs(), model)
        write_atomic(folder / MARKER, manifest_text(manifest), what="checkpoint")


def _problem(folder: Path, plan: Plan) -> str | None:
    """Collective: what is wrong with one complete checkpoint (None: intact, or written without a manifest)."""
    try:
        manifest = read_manifest(folder)
    except (OSError, ValueError) as err:
        return _broadcast(str(err))  # every rank read the same marker; agree on rank 0's verdict
    if manifest is None:
        return None
    if manifest.model_sha256 != model_fingerprint(to_dict(plan.model)):
        raise SpecError(f"--resume: {folder} was written for another model than the plan's {plan.model.name!r}; "
                        "resume with the plan it was trained with, or use another --checkpoint-dir")
    mine = check_files(folder, manifest, _share(sorted(manifest.files)))
    problems = [None] * dist.get_world_size()
    dist.all_gather_object(problems, mine)
    return next((p for p in problems if p is not None), None)


def resume_point(directory: str, resume: bool, plan: Plan) -> Path | None:
    """The checkpoint a run starts from: with ``resume`` the newest intact one (a damaged one is reported in
    one line and skipped); without, None, after making sure the folder holds no checkpoints a fresh run
    would mix with. SpecError when there is nothing to resume."""
    found = complete_checkpoints(directory)
    if not resume:
        if found:
            raise SpecError(f"--checkpoint-dir {directory}: already holds checkpoints (newest {found[0][1].name}); "
                            "pass --resume to continue that run, or choose an empty folder")
        return None
    if not found:
        raise SpecError(f"--resume: no complete checkpoint in {directory} (nothing to resume); "
                        "drop --resume to start from step 1")
    for _, folder in found:
        problem = _problem(folder, plan)
        if problem is None:
            return folder
        if dist.get_rank() == 0:
            print(f"runtime.launch: checkpoint {folder} is damaged ({problem}); trying the previous one",
                  file=sys.stderr, flush=True)
    raise SpecError(f"--resume: every checkpoint in {directory} is damaged (see above); start a fresh run")
