"""One release as a git fast-import stream: the files of its sdist, then its commit.

The commit is a pure function of the sdist and its parent (fixed identity, the newest member's
date, the sdist's name and hash in the message), which is what makes every machine's history agree.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vpatch import git
from vpatch.base import UpstreamError

IDENTITY = "vpatch release history <releases@vpatch.invalid>"
# fast-import needs a branch to commit on; the stream resets it at the end so it is never written.
SCRATCH_REF = "refs/vpatch/release-build"


@dataclass(frozen=True)
class Sdist:
    package: str
    version: str
    path: Path


def _is_generated(path: str) -> bool:
    """Files the sdist build adds that are not upstream source: PKG-INFO and *.egg-info/."""
    parts = path.split("/")
    return path == "PKG-INFO" or any(p.endswith(".egg-info") for p in parts)


def _quote(path: str) -> bytes:
    """A path as a C-style quoted fast-import string, safe for any byte."""
    out = bytearray(b'"')
    for byte in path.encode("utf-8", "surrogateescape"):
        if byte in (0x22, 0x5C):
            out += b"\\" + bytes([byte])
        elif 0x20 <= byte < 0x7F:
            out.append(byte)
        else:
            out += b"\\%03o" % byte
    out += b'"'
    return bytes(out)


def _data(payload: bytes) -> bytes:
    return b"data %d\n" % len(payload) + payload + b"\n"


@dataclass
class Marks:
    next: int = 1

    def take(self) -> int:
        self.next += 1
        return self.next - 1


# setuptools-scm records the upstream commit in vllm/_version.py as commit_id = 'g<sha>'.
_UPSTREAM_RE = re.compile(rb"""commit_id\s*=\s*['"]g?([0-9a-f]{7,40})['"]""")


def _commit_header(mark: int, who: str, message: str, parent: str | None) -> bytes:
    # Reset first: a commit without `from` must be a root, not a child of the scratch branch.
    out = b"reset %s\ncommit %s\nmark :%d\n" % (SCRATCH_REF.encode(), SCRATCH_REF.encode(), mark)
    out += b"author %s\ncommitter %s\n" % (who.encode(), who.encode()) + _data(message.encode())
    return out + (b"from %s\n" % parent.encode() if parent else b"") + b"deleteall\n"


def sdist_stream(sdist: Sdist, parent: str | None, mark: int, marks: Marks) -> Iterator[bytes]:
    """The blobs of one sdist, then its commit as mark `mark` on `parent` (a SHA or ":mark")."""
    top = f"{sdist.package}-{sdist.version}/"
    entries: list[tuple[str, bytes, int]] = []  # (path, mode, blob mark)
    upstream: str | None = None
    date = 0
    digest = hashlib.sha256()
    with sdist.path.open("rb") as raw:
        for chunk in iter(lambda: raw.read(1 << 20), b""):
            digest.update(chunk)
    try:
        with tarfile.open(sdist.path, "r:gz") as tar:
            for member in tar:
                date = max(date, int(member.mtime))
                name = member.name.removeprefix("./")
                if name.rstrip("/") == top.rstrip("/") and member.isdir():
                    continue
                if not name.startswith(top):
                    raise UpstreamError(
                        f"{sdist.path.name}: member {member.name!r} is outside the top folder {top!r}",
                        hint="the file is not a vLLM sdist; delete it from the cache and fetch again",
                    )
                path = name[len(top):].rstrip("/")
                if not path or member.isdir() or _is_generated(path):
                    continue
                if member.issym():
                    mode, payload = b"120000", member.linkname.encode("utf-8", "surrogateescape")
                elif member.isfile() or member.islnk():
                    extracted = tar.extractfile(member)
                    assert extracted is not None
                    payload = extracted.read()
                    mode = b"100755" if member.mode & 0o100 else b"100644"
                    if path == f"{sdist.package}/_version.py" and (found := _UPSTREAM_RE.search(payload)):
                        upstream = found.group(1).decode()
                else:
                    continue  # devices and fifos have no place in a source tree
                blob = marks.take()
                yield b"blob\nmark :%d\n" % blob + _data(payload)
                entries.append((path, mode, blob))
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise UpstreamError(
            f"cannot read {sdist.path}: {exc}", hint="delete it from the cache and fetch it again"
        ) from exc
    message = (
        f"{sdist.package} {sdist.version} (from PyPI sdist {sdist.path.name})\n\n"
        f"Sdist: {sdist.path.name}\nSdist-SHA256: {digest.hexdigest()}\n"
        + (f"Upstream-Commit: {upstream}\n" if upstream else "")
    )
    header = _commit_header(mark, f"{IDENTITY} {date} +0000", message, parent)
    yield header + b"".join(b"M %s :%d %s\n" % (mode, m, _quote(p)) for p, mode, m in entries) + b"\n"


def rewrite_stream(repo: Path, commit: str, parent: str | None, mark: int) -> bytes:
    """A commit with the tree, identity, date and message of `commit` on a new parent."""
    old = git.read_commit(repo, commit)
    assert old.author == old.committer, f"{commit} was not made by vpatch"
    return _commit_header(mark, old.committer, old.message, parent) + b'M 040000 %s ""\n\n' % old.tree.encode()
