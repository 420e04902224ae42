"""One long-lived `git cat-file --batch` per repository for object reads, as git-revise keeps its object database
open: a status run that reads the touched files at a dozen commits starts one git process, not a dozen.

Used by git.py only (the door to git), and only for names that start with a full object id ("<commit>:<path>",
"<commit>"): what those name never changes, so an answer cannot depend on a ref that moved while the reader lived.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from vpatch.base import ChildProcess, GitError

# Readers kept open at once: a test session or a library caller walks many repositories; the least recently
# used is closed, so the open processes (and their pipes) stay few.
_KEEP = 4


class Reader:
    """The conversation with one `cat-file --batch`: one request written, its answer read, then the next (no
    pipelining, so neither side can block on a full pipe)."""

    def __init__(self, repo: Path, argv: Sequence[str], shown: Sequence[str]) -> None:
        self.repo = repo
        # Which folder it serves: a repository deleted and made again at the same path needs a new reader. The
        # folder is held open, so its inode cannot be handed to a new folder while this reader lives.
        try:
            self.held = os.open(repo, os.O_RDONLY)
        except OSError as exc:
            raise GitError(f"cannot run {' '.join(shown)} in {repo}: {exc.strerror or exc}", command=tuple(argv),
                           returncode=None, output="", hint="is the repository there? vpatch fetch (or vpatch "
                           "releases) makes the upstream one") from None
        st = os.fstat(self.held)
        self.identity = (st.st_dev, st.st_ino)
        self.pid = os.getpid()
        self.lock = threading.Lock()
        try:
            self.child = ChildProcess(argv, cwd=repo, shown=shown, error=GitError)
        except BaseException:
            os.close(self.held)
            raise
        self.closed = False

    def usable(self) -> bool:
        return (not self.closed and self.pid == os.getpid() and self.child.running()
                and self.identity == _identity(self.repo))

    def read(self, names: Sequence[str]) -> list[tuple[str, bytes] | None]:
        """(type, content) of each named object, None where git has no such object (or path)."""
        with self.lock:
            return [self._one(name) for name in names]

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                self.child.close()
            if self.held >= 0:
                os.close(self.held)
                self.held = -1

    def _one(self, name: str) -> tuple[str, bytes] | None:
        if "\n" in name:  # would end the request early and leave the conversation out of step
            raise GitError(f"git cat-file --batch cannot read {name!r}: a line break in the name",
                           command=self.child.command, returncode=None, output="")
        try:
            self.child.stdin.write(name.encode("utf-8", "surrogateescape") + b"\n")
            self.child.stdin.flush()
            header = self.child.stdout.readline()
        except OSError as exc:
            raise self._broken(f"stopped answering ({exc.strerror or exc})") from None
        if not header.endswith(b"\n"):
            raise self._broken(f"ended without answering {name!r}")
        if header.endswith((b" missing\n", b" ambiguous\n")):
            return None
        fields = header.split()
        if len(fields) != 3 or not fields[2].isdigit():
            raise self._broken(f"answered {name!r} with {header[:200]!r}")
        size = int(fields[2])
        data = self.child.stdout.read(size + 1)
        if len(data) != size + 1 or not data.endswith(b"\n"):
            raise self._broken(f"cut {name!r} short")
        return fields[1].decode(), data[:-1]

    def _broken(self, what: str) -> GitError:
        self.closed = True
        os.close(self.held)
        self.held = -1
        error = self.child.failed(what)
        assert isinstance(error, GitError)
        return error


_readers: OrderedDict[Path, Reader] = OrderedDict()
_registry = threading.Lock()


def read(repo: Path, argv: Sequence[str], shown: Sequence[str], names: Sequence[str]) -> list[tuple[str, bytes] | None]:
    """`Reader.read` on this repository's reader (`argv` starts it when there is none yet)."""
    if not names:
        return []
    return _reader(repo, argv, shown).read(names)


def close_all() -> None:
    """Close every reader this process started (at exit, or where a caller wants no git left running)."""
    with _registry:
        readers = list(_readers.values())
        _readers.clear()
    for reader in readers:
        if reader.pid == os.getpid():
            reader.close()


def _reader(repo: Path, argv: Sequence[str], shown: Sequence[str]) -> Reader:
    key = Path(os.path.abspath(repo))
    stale: list[Reader] = []
    with _registry:
        reader = _readers.pop(key, None)
        if reader is not None and not reader.usable():
            stale.append(reader)
            reader = None
        if reader is None:
            reader = Reader(key, argv, shown)
        _readers[key] = reader
        while len(_readers) > _KEEP:
            stale.append(_readers.popitem(last=False)[1])
    for old in stale:
        if old.pid == os.getpid():  # a forked child leaves its parent's reader to the parent
            old.close()
    return reader


def _identity(repo: Path) -> tuple[int, int]:
    try:
        st = os.stat(repo)
    except OSError:
        return (-1, -1)
    return (st.st_dev, st.st_ino)


atexit.register(close_all)
