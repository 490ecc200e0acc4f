"""``runtime.launch --init-from DIR`` and ``--save-hf DIR``: where a training run meets Hugging Face folders.

Start: the rank's stage models are materialised straight from the folder (build.py ``init_from``: no
seeded draw first), unless the run resumes from a checkpoint: then the checkpoint wins (it is the later
state of the same run), the models start from the seeded values the checkpoint overwrites, and rank 0
says so.

End (``--save-hf``): the final weights are saved as a checkpoint of ours (collective; every rank writes
its own shards, as for any checkpoint), then rank 0 alone, after the process group is gone, converts it
(export.py). Through a checkpoint rather than gathering the full tensors onto rank 0 because it is the
path ``autoplan export-hf`` takes too (one conversion, tested once), it needs no memory beyond one output
shard on rank 0, and the conversion, which can take minutes for a large model, runs after the
collectives: no other rank waits on a barrier that could time out. The checkpoint is the run's last one
in ``--checkpoint-dir`` when there is one (saved at the last step if the run did not), else a weights-only
checkpoint in ``DIR.checkpoint.tmp`` beside the output, removed after the export. Either must be on a file
system every rank sees (as any checkpoint folder).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch.distributed as dist

from runtime.train import checkpoint, guard
from runtime.train.manifest import complete_checkpoints


def folder_to_read(folder: str, checkpoint_dir: str | None, resume: bool) -> Path | None:
    """``folder``, or None when a checkpoint is about to be resumed (which wins; rank 0 says so)."""
    if resume and checkpoint_dir and complete_checkpoints(checkpoint_dir):
        if dist.get_rank() == 0:
            print(f"runtime.launch: --init-from {folder}: not read, the run resumes from its checkpoint in "
                  f"{checkpoint_dir}", file=sys.stderr, flush=True)
        return None
    return Path(folder)


def transient_folder(save_hf: str) -> Path:
    return Path(f"{save_hf}.checkpoint.tmp")


def save_at_end(trainer, steps: int, checkpoint_dir: str | None, save_hf: str) -> Path:
    """Collective: the checkpoint holding the final weights (see the module docstring)."""
    parts, plan = trainer.parts, trainer.plan
    if checkpoint_dir:
        found = complete_checkpoints(checkpoint_dir)
        if found and found[0][0] == steps:
            return found[0][1]
        guard.check_weights(parts.parameters(), steps, found[0][1] if found else None, trainer.pm.device)
        return checkpoint.save(checkpoint_dir, steps, parts.models, parts.optimizer, plan.model, plan)
    root = transient_folder(save_hf)
    guard.check_weights(parts.parameters(), steps, None, trainer.pm.device)
    if dist.get_rank() == 0:
        shutil.rmtree(root, ignore_errors=True)  # a crashed run's; save's barrier orders this before the writes
    return checkpoint.save(str(root), steps, parts.models, None, plan.model, plan)


def export_at_end(saved: Path, save_hf: str, spec) -> None:
    """Rank 0, after the process group is destroyed: ``saved`` as a Hugging Face folder ``save_hf``."""
    from runtime.hf.export import export_checkpoint

    export_checkpoint(saved, save_hf, spec)
    transient = transient_folder(save_hf)
    if saved.parent == transient:
        shutil.rmtree(transient, ignore_errors=True)
    print(f"runtime.launch: wrote {save_hf} (Hugging Face: config.json + safetensors) from {saved}", flush=True)
