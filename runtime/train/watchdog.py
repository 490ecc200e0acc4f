"""The hang watchdog and the one line a rank prints when a collective or pipeline action fails.

The watchdog is torch's own: every collective and point-to-point wait of a process group gives up after
the group's timeout (``--timeout``, default 300 s, given to every group: ``set_timeout``) -- gloo raises
in the waiting rank, NCCL's watchdog thread aborts the process. What torch does not do is say *what* waited: gloo's message
names a recv buffer, and a pipeline schedule logs its whole action table first. ``describe`` reads the
traceback instead: the pipeline action the schedule was running (``1F3`` = stage 1, forward, micro-batch
3), else the torch.distributed call and the runtime function that made it, and the training step.

Only one rank prints: every rank waiting on a dead or stopped peer fails at about the same moment, and
the first to claim the report in torchrun's store (an atomic counter) speaks for the job.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from types import TracebackType

DEFAULT_TIMEOUT_S = 300.0
TIMEOUT_EXIT = 4
"""runtime.launch's status when a collective timed out (the launcher restarts: it can be transient)."""
PEER_LOST_EXIT = 5
"""... when a peer went away mid-collective (the launcher restarts: the peer was killed or crashed)."""
NON_FINITE_EXIT = 3
"""... when the loss, the gradient norm or the weights stopped being finite (no restart: it would recur)."""

_TIMEOUT_WORDS = ("timed out", "timeout")
_PEER_WORDS = ("connection closed", "connection reset", "broken pipe", "connection refused", "socket closed",
               "nccl error", "ncclremoteerror", "ncclsystemerror")


def set_timeout(seconds: float) -> timedelta:
    """The timeout for every process group this process creates, before the first one is created.

    ``init_process_group(timeout=...)`` sets it for the world group only: ``new_group(timeout=None)``
    takes the backend's default (30 min gloo, 10 min NCCL) and DeviceMesh passes None for its pp/dp/tp
    groups, with no public way to pass one. So the defaults torch reads at each ``new_group`` are set
    here (``distributed_c10d.default_pg_timeout`` / ``default_pg_nccl_timeout``)."""
    from torch.distributed import distributed_c10d

    timeout = timedelta(seconds=seconds)
    distributed_c10d.default_pg_timeout = timeout
    distributed_c10d.default_pg_nccl_timeout = timeout
    return timeout


def quiet_schedule_logs() -> None:
    """torch's pipeline schedules log the full action table on any failure (dozens of lines); our one
    line names the action instead."""
    logging.getLogger("torch.distributed.pipelining").setLevel(logging.CRITICAL)


def _frames(tb: TracebackType | None):
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def _action(tb: TracebackType | None) -> str:
    action = dist_call = our_call = None
    step = None
    for frame, line in _frames(tb):
        path, name = frame.f_code.co_filename, frame.f_code.co_name
        if "torch/distributed/pipelining" in path and "action" in frame.f_locals:
            action = frame.f_locals["action"]
        elif "torch/distributed/distributed_c10d.py" in path and not name.startswith("_") and name != "wrapper":
            dist_call = dist_call or name
        elif "/runtime/" in path:
            our_call = f"{path.split('/runtime/')[-1]}:{line} {name}"
            if name == "run" and isinstance(frame.f_locals.get("step"), int):
                step = frame.f_locals["step"] + 1
    what = " ".join(p for p in (f"pipeline action {action}" if action is not None else None, dist_call) if p)
    what = what or "a collective"
    if our_call is not None:
        what += f" (runtime/{our_call})"
    return f"step {step}: {what}" if step is not None else what


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and the errors it was raised from: torch's pipelining wraps a failed collective of a stage's
    backward (a DTensor all-reduce run by the autograd engine) in its own RuntimeError("Failed to run stage
    backward ...") ``from`` the gloo error, so the words that say "lost a peer" are only in the cause."""
    seen: list[BaseException] = []
    while err is not None and err not in seen and len(seen) < 16:
        seen.append(err)
        err = err.__cause__ or err.__context__
    return seen


def describe(err: BaseException, timeout_s: float) -> tuple[str, int] | None:
    """(one line, exit status) for a failure of a collective or pipeline action; None for anything else
    (a bug, which keeps its traceback)."""
    chain = [e for e in _chain(err) if isinstance(e, RuntimeError)]  # DistError subclasses RuntimeError
    in_dist = any("torch/distributed" in f.f_code.co_filename for e in chain for f, _ in _frames(e.__traceback__))
    if not in_dist or not isinstance(err, RuntimeError):
        return None
    where = _action(err.__traceback__)
    for kind, words in ((TIMEOUT_EXIT, _TIMEOUT_WORDS), (PEER_LOST_EXIT, _PEER_WORDS)):
        cause = next((e for e in chain if any(w in str(e).lower() for w in words)), None)
        if cause is None:
            continue
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        detail = first.split("] ", 1)[-1][:160]  # drop gloo's source-file prefix
        if kind == TIMEOUT_EXIT:
            return (f"{where} waited longer than --timeout {timeout_s:g} s ({detail}); a peer rank stopped or "
                    "hangs", TIMEOUT_EXIT)
        return f"{where} lost a peer rank ({detail}); another rank died first", PEER_LOST_EXIT
    return None


def first_to_report() -> bool:
    """Whether this rank is the first of the job to report a failure (True when that cannot be known)."""
    try:
        from torch.distributed import distributed_c10d

        store = distributed_c10d._get_default_store()  # private, hence the fallback: worst case every rank speaks
        store.set_timeout(timedelta(seconds=2))
        return store.add("autoplan/failure_reported", 1) == 1
    except Exception:  # noqa: BLE001 - the store may be gone with the peer; then just speak
        return True


def _teardown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def report(err: BaseException, rank: int, timeout_s: float) -> int | None:
    """Print the one line for a failure that ends training (a non-finite stop, a timeout, a lost peer)
    and return runtime.launch's exit status; None for anything else (a bug: it keeps its traceback)."""
    import sys

    from runtime.train.guard import NonFiniteStop

    if isinstance(err, NonFiniteStop):
        if rank == 0:  # every rank stops at the same step with the same numbers
            print(f"runtime.launch: {err}", file=sys.stderr, flush=True)
        _teardown()  # all ranks are here, so leave as a finished run does (no abort at exit)
        return NON_FINITE_EXIT
    described = describe(err, timeout_s)
    if described is None:
        return None
    line, status = described
    if first_to_report():
        print(f"runtime.launch (rank {rank}): error: {line}", file=sys.stderr, flush=True)
    return status
