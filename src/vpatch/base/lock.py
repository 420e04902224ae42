"""Exclusive locks between vpatch processes, held for the length of a `with` block.

An advisory `flock` on a file that records the holder's pid: the kernel drops the lock when its
holder dies, however it dies, so a lock left by a killed run is simply taken over (no stale-lock
guessing from pids or ages); the pid is only there to name the holder in the message.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from vpatch.base.errors import VpatchError
from vpatch.base.paths import cache_dir, state_dir


class LockedError(VpatchError):
    """Another vpatch process holds the lock."""


class LockFolderError(VpatchError):
    """The lock file cannot be created (the folder is read-only, full, not a folder)."""


@contextmanager
def exclusive(path: Path, *, what: str, holder: str | None = None, wait: bool = False) -> Iterator[None]:
    """Hold the lock file `path` for the block; LockedError when another process holds it, or, with `wait`,
    wait until it lets go (for locks held a moment, around one step, never around a whole command).

    `what` names the work in the message: "another {what} is running (pid N)". `holder`, when given, is
    recorded with the pid, and a process refused by this lock later names that instead of its own `what`.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        # Read-only, full, a file where the folder should be, a name too long: nothing was touched yet.
        raise _unwritable(path, exc) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            recorded = os.pread(fd, 200, 0).decode("utf-8", "replace").split(maxsplit=1)
            pid = recorded[0] if recorded else "unknown"
            running = recorded[1].strip() if len(recorded) > 1 else what
            raise LockedError(f"another {running} is running (pid {pid})",
                              hint=f"wait for it to finish, then run the command again (lock: {path})") from None
        # The previous holder may have died mid-run: its pid is replaced, its lock is already gone.
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (f"{os.getpid()} {holder}\n" if holder else f"{os.getpid()}\n").encode(), 0)
        except OSError:
            pass  # a full disk loses the holder's name in a refusal's message, not the lock
        yield
    finally:
        os.close(fd)


_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def host_lock_folder() -> Path:
    return state_dir() / "locks"


@contextmanager
def host_resources(folder: Path, *, container: str, port: int | None, holder: str) -> Iterator[None]:
    """The locks of what a server occupies on this host, its container name and its port, for the block:
    serve, deploy, rollback and prune take these, whichever definition names them, so no two of them act
    on one container or one port at a time (seen: `serve --replace` removed the candidate a deploy was
    checking). Taken in one order (sorted), so two holders of overlapping sets cannot wait on each other."""
    names = [f"container-{_SAFE.sub('_', container)[:200]}.lock"] + ([f"port-{port}.lock"] if port else [])
    with ExitStack() as stack:
        for name in sorted(names):
            what = f"vpatch run on {'the container ' + container if name.startswith('container-') else f'port {port}'}"
            stack.enter_context(exclusive(folder / name, what=what, holder=holder))
        yield


def _unwritable(path: Path, exc: OSError) -> LockFolderError:
    """Why the lock file `path` cannot be made. A link to a folder that is gone, and a file where a folder should be,
    are named as such: mkdir says only "File exists" of both (a cache folder linked to one since removed)."""
    for folder in (path.parent, *path.parent.parents):
        if folder.is_symlink() and not folder.exists():
            target = folder.parent / os.readlink(folder)
            return LockFolderError(f"cannot take the lock {path}: {folder} is a link to {target}, which does not exist",
                                   hint=f"create {target}, or remove the link {folder} (vpatch then makes a folder "
                                   "there)")
    reason = exc.strerror or str(exc)
    for folder in (path.parent, *path.parent.parents):
        if folder.exists() and not folder.is_dir():  # mkdir says "File exists" of this too
            reason = f"{folder} is a file, not a folder"
            break
    moves = ""
    for variable, root in (("VPATCH_CACHE", cache_dir), ("VPATCH_STATE", state_dir)):
        try:
            if path.is_relative_to(root()):
                moves = f"; ${variable} moves that folder elsewhere"
        except VpatchError:
            pass  # a relative $VPATCH_STATE: the command that reads it says so
    return LockFolderError(f"cannot take the lock {path}: {reason}", hint=f"{path.parent} must be a writable folder{moves}")
