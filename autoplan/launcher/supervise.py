"""torchrun as a supervised process group: signals reach it, nothing outlives it, failures restart it.

Why our own: torchrun puts every worker in a session of its own (``start_new_session``), so killing
``autoplan run`` (or pressing Ctrl-C) used to leave torchrun and all workers running; and torchrun's own
``--max-restarts`` cannot re-form a gloo group in torch 2.13 (the restarted workers try to connect to the
dead round's addresses: "Gloo connectFullMesh failed ... Connection refused"). So:

* torchrun runs in a process group of its own; SIGINT, SIGTERM and SIGHUP to the launcher become one
  SIGTERM to that group (torchrun then stops its workers; a SIGINT would make every worker print a
  KeyboardInterrupt traceback); a second signal, or ``GRACE_S`` without an exit, SIGKILLs everything
  left; torchrun gets SIGTERM if the launcher itself dies (Linux ``PR_SET_PDEATHSIG``);
* the launcher is a child subreaper (Linux), so workers orphaned by a dead torchrun stay its
  descendants, and whatever is still alive below it when torchrun has exited is killed;
* ``run_attempts`` starts a fresh torchrun after a failed attempt, resuming from the newest complete
  checkpoint, unless the failure was deliberate (bad input, a non-finite stop) or the user stopped it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 5.0
"""Seconds between the forwarded SIGTERM and SIGKILL for whatever is left (the issue's bound is 10 s)."""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
DELIBERATE = (2, 3)
"""runtime.launch statuses that a restart would only repeat: 2 bad input, 3 non-finite numbers."""
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the snapshot of descendants still catches most
        pass


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time in clock ticks) from /proc; empty where /proc does not exist."""
    table = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            table[int(entry.name)] = (int(fields[1]), int(fields[19]))
        except (OSError, IndexError, ValueError):
            continue
    return table


def descendants(root: int, table: dict[int, tuple[int, int]] | None = None) -> dict[int, int]:
    """pid -> start time of every process below ``root``."""
    table = _proc_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {}, [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            if pid not in found:
                found[pid] = table[pid][1]
                todo.append(pid)
    return found


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class Job:
    """One torchrun attempt."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.cmd, self.env = cmd, env
        self.stop_signal: int | None = None
        self._stop_at = 0.0
        self._seen: dict[int, int] = {}
        self.proc: subprocess.Popen | None = None

    def run(self) -> int:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        try:
            self.proc = subprocess.Popen(self.cmd, env=self.env, start_new_session=True, preexec_fn=_die_with_parent)
            if self.stop_signal is not None:  # the signal came while torchrun was being started
                os.killpg(self.proc.pid, signal.SIGTERM)
            while True:
                try:
                    returncode = self.proc.wait(timeout=0.25)
                    break
                except subprocess.TimeoutExpired:
                    self._seen.update(descendants(self.proc.pid))
                    if self.stop_signal is not None and time.monotonic() - self._stop_at > GRACE_S:
                        self._kill_everything()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self._kill_leftovers()
        return exit_status(returncode)

    def _on_signal(self, signum: int, _frame) -> None:
        if self.stop_signal is not None:  # asked twice: do not wait any longer
            self._kill_everything()
            return
        self.stop_signal, self._stop_at = signum, time.monotonic()
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _kill_everything(self) -> None:
        for pid in [*descendants(os.getpid()), *self._seen]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _kill_leftovers(self) -> None:
        """After torchrun exited: SIGKILL what is left of its tree (orphaned workers, by pid and start time)."""
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            table = _proc_table()
            left = [pid for pid, start in {**self._seen, **descendants(os.getpid(), table)}.items()
                    if pid in table and table[pid][1] == start]
            if not left:
                return
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            _reap()
            time.sleep(0.05)


def _reap() -> None:
    """Collect orphans that were reparented to us (the subreaper) and have died."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def why(status: int) -> str:
    if status > 128:
        try:
            return f"a rank was killed by {signal.Signals(status - 128).name}"
        except ValueError:
            return f"status {status}"
    return {4: "a collective timed out", 5: "a rank lost its peers"}.get(status, f"status {status}")


def run_attempts(make_cmd, env: dict[str, str], max_restarts: int, newest_checkpoint) -> int:
    """Start torchrun up to 1 + ``max_restarts`` times. ``make_cmd(resume: bool)`` builds one attempt's
    command; ``newest_checkpoint()`` names the newest complete checkpoint (None when there is none yet)."""
    status = 0
    for attempt in range(max_restarts + 1):
        resume = attempt > 0 and newest_checkpoint() is not None
        job = Job(make_cmd(resume), env)
        status = job.run()
        if job.stop_signal is not None:
            name = signal.Signals(job.stop_signal).name
            print(f"autoplan run: stopped on {name}; torchrun and its workers are gone", file=sys.stderr, flush=True)
            return 128 + job.stop_signal
        if status == 0 or status in DELIBERATE or attempt == max_restarts:
            return status
        newest = newest_checkpoint()
        start = f"from {newest}" if newest is not None else "from step 1 (no checkpoint yet)"
        print(f"autoplan run: attempt {attempt + 1} failed ({why(status)}); restarting {start} "
              f"(restart {attempt + 1} of {max_restarts})", file=sys.stderr, flush=True)
    return status
