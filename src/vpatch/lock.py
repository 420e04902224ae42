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

PROJECT_LOCK = "vpatch.lock"


class LockedError(VpatchError):
    """Another vpatch process holds the lock."""


@contextmanager
def exclusive(path: Path, *, what: str, holder: str | None = None) -> Iterator[None]:
    """Hold the lock file `path` for the block; LockedError when another process holds it.

    `what` names the work in the message: "another {what} is running (pid N)". `holder`, when given, is
    recorded with the pid, and a process refused by this lock later names that instead of its own `what`.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            recorded = os.pread(fd, 200, 0).decode("utf-8", "replace").split(maxsplit=1)
            pid = recorded[0] if recorded else "unknown"
            running = recorded[1].strip() if len(recorded) > 1 else what
            raise LockedError(f"another {running} is running (pid {pid})",
                              hint=f"wait for it to finish, then run the command again (lock: {path})") from None
        # The previous holder may have died mid-run: its pid is replaced, its lock is already gone.
        os.ftruncate(fd, 0)
        os.pwrite(fd, (f"{os.getpid()} {holder}\n" if holder else f"{os.getpid()}\n").encode(), 0)
        yield
    finally:
        os.close(fd)


def project_lock_path(root: Path) -> Path:
    """The project's lock: beside git's own state when the project is in a repository, else in .vpatch/."""
    from vpatch import git

    top = git.toplevel(root)
    return root / ".vpatch" / PROJECT_LOCK if top is None else git.git_dir(top) / PROJECT_LOCK


@contextmanager
def held(root: Path, command: str) -> Iterator[None]:
    """The project lock for `vpatch <command>`: update (with --continue/--abort), apply, export and new
    never run at the same time on one checkout, so none deletes or writes over another's work."""
    with exclusive(project_lock_path(root), what=f"vpatch {command}", holder=f"vpatch {command}"):
        yield
