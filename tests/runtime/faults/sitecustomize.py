"""Test-only fault injection into torchrun workers; Python imports this file at start-up when this folder
is on PYTHONPATH (``site`` imports ``sitecustomize``), so the product has no hooks for it.

``AUTOPLAN_TEST_FAULT="POINT:RANK:STEP:MARKER[,...]"`` makes global rank RANK (``*``: every rank)
misbehave at training step STEP (1-based, as in the metrics), once: MARKER is created when the fault
fires, and a fault whose marker exists is skipped, so the attempt the launcher restarts runs clean.

  mid-step    SIGKILL itself inside step STEP: after the backward, before the optimizer update
  mid-save    SIGKILL itself in the save of step STEP: its DCP shard is written, COMPLETE is not
  after-save  SIGKILL itself just after the save of step STEP has completed (renamed into place)
  nan-lr      use a NaN learning rate for the update of step STEP (a run diverging, which the plan's
              validation would refuse as input)
  hang        sleep for an hour inside step STEP (a rank stuck before its next collective)

Only public torch hooks and module attributes are used: a global optimizer step pre-hook
(``torch.optim.optimizer.register_optimizer_step_pre_hook``), and wrappers around
``torch.distributed.checkpoint.save`` and ``runtime.train.checkpoint.save``.
"""

import os


def _faults():
    spec = os.environ.get("AUTOPLAN_TEST_FAULT", "")
    rank = os.environ.get("RANK")
    if not spec or rank is None or "TORCHELASTIC_RUN_ID" not in os.environ:
        return []
    out = []
    for item in spec.split(","):
        point, who, step, marker = item.split(":", 3)
        if who in ("*", rank):
            out.append((point, int(step), marker))
    return out


def _fire(marker: str) -> bool:
    """True the first time for this marker, across attempts and ranks (an atomic create)."""
    if marker.endswith("*"):  # one marker per rank (faults on every rank)
        marker = marker[:-1] + os.environ["RANK"]
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def _die() -> None:
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def _install(faults) -> None:
    import time

    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    steps = {"n": 0}

    def before_update(optimizer, _args, _kwargs):
        steps["n"] += 1
        for point, step, marker in faults:
            if steps["n"] != step or point not in ("mid-step", "nan-lr", "hang"):
                continue
            if not _fire(marker):
                continue
            if point == "mid-step":
                _die()
            elif point == "nan-lr":
                for group in optimizer.param_groups:
                    group["lr"] = float("nan")
            else:
                time.sleep(3600)

    register_optimizer_step_pre_hook(before_update)

    import torch.distributed.checkpoint as dcp

    real_dcp_save = dcp.save

    def dcp_save(*args, **kwargs):
        out = real_dcp_save(*args, **kwargs)
        folder = os.path.basename(str(kwargs.get("checkpoint_id", "")))
        for point, step, marker in faults:
            if point == "mid-save" and folder == f"step_{step}.tmp" and _fire(marker):
                _die()
        return out

    dcp.save = dcp_save

    import runtime.train.checkpoint as ckpt

    real_save = ckpt.save

    def save(directory, step, *args, **kwargs):
        out = real_save(directory, step, *args, **kwargs)
        for point, at, marker in faults:
            if point == "after-save" and step == at and _fire(marker):
                _die()
        return out

    ckpt.save = save
    del torch


_FAULTS = _faults()
if _FAULTS:
    _install(_FAULTS)
