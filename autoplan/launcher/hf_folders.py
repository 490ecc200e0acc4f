"""``autoplan run --init-from DIR`` / ``--save-hf DIR``: the Hugging Face folders, checked before any
process starts (runtime/hf/files.py, torch-free: config.json against the plan's model, every tensor's
name, shape and dtype from the safetensors headers; the output folder new or empty). Paths of an sbatch
script are left to the ranks on the cluster, which run the same checks."""

from __future__ import annotations

import argparse

from autoplan.errors import SpecError
from autoplan.schema import Plan


def check_hf_folders(args: argparse.Namespace, plan: Plan, on_this_host: bool) -> None:
    init_from, save_hf = getattr(args, "init_from", None), getattr(args, "save_hf", None)
    for flag, value in (("--init-from", init_from), ("--save-hf", save_hf)):
        if value == "":
            raise SpecError(f"{flag}: empty; give a folder")
    if not on_this_host:
        return
    from runtime.hf.files import check_init_folder, check_output

    if init_from is not None:
        check_init_folder(init_from, plan.model, plan.training.seq_len)
    if save_hf is not None:
        check_output(save_hf, force=False, flag="--save-hf", can_force=False, spec=plan.model)
