"""``python -m runtime.torchrun ARGS``: torchrun itself, but a failed job ends with one line, not ~40.

torchrun reports a failed worker with its own log lines and a ChildFailedError traceback of its own
frames, after the worker has already said what went wrong (runtime.launch prints one line per failure it
understands). Here torch's ``torch.distributed.run.main`` runs unchanged with its own loggers at
CRITICAL (the workers' logging is untouched), and its ChildFailedError becomes:

* a line for each rank killed by a signal other than the SIGTERM torchrun itself sends to stop the
  survivors (such a rank could not speak for itself), and
* an exit status the launcher (``autoplan run``) can act on (``status_of``; the statuses are listed
  in ``runtime/train/watchdog.py``).
"""

from __future__ import annotations

import logging
import signal
import sys

DELIBERATE = (2, 3)
"""Statuses a rank exits with after printing why; no other rank's status explains the job better."""
_TORCHRUN_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.distributed.run")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def status_of(failures: dict) -> int:
    """The job's exit status from torchrun's {global rank: ProcessFailure}: the cause, not its echoes.
    A rank that stopped on purpose (2, 3) or timed out (4) explains the job; else a rank killed by a
    signal other than the SIGTERM torchrun sends the survivors (128 + signal); else the first other
    failure (5: a rank that lost its peers, 1: a bug)."""
    codes = [f.exitcode for f in sorted(failures.values(), key=lambda f: f.timestamp)]
    for code in (*DELIBERATE, 4):
        if code in codes:
            return code
    killed = [c for c in codes if c < 0 and c != -signal.SIGTERM]
    if killed:
        return 128 - killed[0]
    positive = [c for c in codes if c > 0]
    return positive[0] if positive else 128 + signal.SIGTERM


def _quiet_torchrun_logs() -> None:
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(_TORCHRUN_LOGGERS):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    for name in _TORCHRUN_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    _quiet_torchrun_logs()
    try:
        torchrun_main(argv)
        return 0
    except ChildFailedError as err:
        for rank, failure in sorted(err.failures.items()):
            if failure.exitcode < 0 and failure.exitcode != -signal.SIGTERM:
                print(f"runtime.torchrun: rank {rank} (pid {failure.pid}) was killed by "
                      f"{_signal_name(-failure.exitcode)}", file=sys.stderr, flush=True)
        return status_of(err.failures)
    except SignalException as err:  # torchrun was told to stop; it has stopped its workers
        return 128 + int(err.sigval)


if __name__ == "__main__":
    sys.exit(main())
