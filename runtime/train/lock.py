"""One run per checkpoint folder: rank 0 holds an exclusive ``flock`` on ``DIR/.lock`` while it trains.

Two runs writing ``step_N`` into one folder replace each other's shards half-way; with the lock the
second one stops before it starts, with one line naming the holder. ``flock`` is released by the kernel
when the holder dies however it dies, so there are no stale locks to clean up. Torch-free: ``autoplan
run`` checks the lock in its preflight too.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from autoplan.errors import SpecError

LOCK_NAME = ".lock"


class DirectoryLock:
    def __init__(self, directory: str | os.PathLike) -> None:
        self.path = Path(directory) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> "DirectoryLock":
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise SpecError(f"--checkpoint-dir {folder}: cannot use it ({err.strerror}); give a writable folder") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise SpecError(f"--checkpoint-dir {self.path.parent}: in use by {holder}; wait for that run to "
                            "finish or choose another folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                  .encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def check_free(directory: str | os.PathLike) -> None:
    """SpecError if another run holds the folder's lock (takes and drops it at once otherwise)."""
    if (Path(directory) / LOCK_NAME).exists():
        DirectoryLock(directory).acquire().release()
