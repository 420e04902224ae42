"""Exclusive locks between vpatch processes, held for the length of a `with` block.

An advisory `flock` on a file that records the holder's pid: the kernel drops the lock when its
holder dies, however it dies, so a lock left by a killed run is simply taken over (no stale-lock
guessing from pids or ages); the pid is only there to name the holder in the message.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vpatch.errors import VpatchError


class LockedError(VpatchError):
    """Another vpatch process holds the lock."""


@contextmanager
def exclusive(path: Path, *, what: str) -> Iterator[None]:
    """Hold the lock file `path` for the block; LockedError when another process holds it.

    `what` names the work in the message: "another {what} is running (pid N)".
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise LockedError(f"another {what} is running (pid {holder})",
                              hint=f"wait for it to finish, then run the command again (lock: {path})") from None
        # The previous holder may have died mid-run: its pid is replaced, its lock is already gone.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
