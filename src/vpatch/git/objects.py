"""The object database: reading blobs and commits, writing blobs, commits and fast-import streams."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vpatch.base import GitError, feed_process
from vpatch.git import catfile
from vpatch.git.core import command, is_object_id, run


def read_blobs(repo: Path, treeish: str, paths: Sequence[str]) -> dict[str, bytes | None]:
    """Contents of `paths` in `treeish`, read from the object database (None: path absent)."""
    return read_blobs_at(repo, [treeish], paths)[treeish]


def read_blobs_at(repo: Path, commits: Sequence[str], paths: Sequence[str]) -> dict[str, dict[str, bytes | None]]:
    """Contents of `paths` at each of `commits` (commit -> path -> content; None: absent, or no file there).

    Names that are object ids are read by this process's one `cat-file --batch` for `repo` (catfile.py);
    others (a branch, HEAD) by a `cat-file --batch` of their own, so a moved ref is always read as it is now."""
    out: dict[str, dict[str, bytes | None]] = {c: {} for c in commits}
    if not commits or not paths:
        return out
    by_id = [c for c in commits if is_object_id(c)]
    found = iter(cat_objects(repo, [f"{c}:{p}" for c in by_id for p in paths]))
    for c in by_id:
        for p in paths:
            obj = next(found)
            # a tree or gitlink at that path is no file
            out[c][p] = obj[1] if obj is not None and obj[0] == "blob" else None
    others = [c for c in commits if not is_object_id(c)]
    if others:
        request = "".join(f"{c}:{p}\n" for c in others for p in paths).encode()
        data = run(repo, ["cat-file", "--batch"], input=request).stdout
        pos = 0
        for c in others:
            for p in paths:
                nl = data.index(b"\n", pos)
                header = data[pos:nl].split()
                pos = nl + 1
                if header[-1] == b"missing" or len(header) != 3:
                    out[c][p] = None
                    continue
                size = int(header[2])
                # a tree at that path is no file, but its content is in the stream all the same
                out[c][p] = data[pos:pos + size] if header[1] == b"blob" else None
                pos += size + 1
    return out


def cat_objects(repo: Path, names: Sequence[str]) -> list[tuple[str, bytes] | None]:
    """(type, content) of each object named by an object id, from the repository's long-lived reader."""

    return catfile.read(repo, command(["cat-file", "--batch"]), ["git", "cat-file", "--batch"], names)


def missing_blobs(repo: Path, treeishes: Sequence[str], paths: Sequence[str] | None) -> list[str]:
    """The blobs at `paths` (None: every file) in any of `treeishes` that a partial clone has not fetched yet, each
    once: read from the trees alone (`rev-list --missing=print` fetches nothing). Empty in a full repository."""
    if not treeishes or (paths is not None and not paths):
        return []
    # trees, not commits, as the walk's starts: a commit that leaves `paths` as its parent had them is not skipped
    request = "".join(f"{c}^{{tree}}\n" for c in treeishes).encode()
    out = run(repo, ["--literal-pathspecs", "rev-list", "--objects", "--missing=print", "--no-walk", "--stdin",
                     "--", *(paths or ())], input=request).out
    return sorted({line[1:].strip() for line in out.splitlines() if line.startswith("?")})


def ls_tree(repo: Path, treeish: str, paths: Sequence[str]) -> list[tuple[str, str, str, str]]:
    """(mode, type, sha, path) entries for `paths` in `treeish`; absent paths are left out."""
    if not paths:
        return []
    out = run(repo, ["ls-tree", "-z", "--full-tree", treeish, "--", *paths]).stdout
    entries = []
    for record in out.split(b"\0"):
        if not record:
            continue
        meta, path = record.split(b"\t", 1)
        mode, kind, sha = meta.decode().split()
        entries.append((mode, kind, sha, path.decode("utf-8", "surrogateescape")))
    return entries


def files_under(repo: Path, treeish: str, folder: str) -> list[str]:
    """Every file path under `folder` in `treeish` (recursively); [] when the folder is not there."""
    out = run(repo, ["ls-tree", "-r", "-z", "--name-only", "--full-tree", treeish, "--", folder]).stdout
    return [record.decode("utf-8", "surrogateescape") for record in out.split(b"\0") if record]


def hash_object(repo: Path, data: bytes) -> str:
    """Store `data` as a blob in `repo`'s object database; returns its id."""
    return run(repo, ["hash-object", "-w", "--stdin"], input=data).out.strip()


def fast_import(repo: Path, stream: Iterable[bytes]) -> dict[str, str]:
    """Feed a fast-import stream (ending in `done`) to `repo`; returns its marks (":N" -> sha).

    The stream is written as it is produced, so a large import never sits in memory whole.
    Refs named in the stream are updated only when git reaches `done`; an interrupted import
    leaves loose objects but no ref changes.
    """
    with tempfile.TemporaryDirectory(prefix="vpatch-fast-import-") as tmp:
        marks = Path(tmp, "marks")
        args = ["fast-import", "--quiet", "--done", f"--export-marks={marks}"]
        feed_process(command(args), stream, cwd=repo, shown=["git", *args[:3]], error=GitError)
        result: dict[str, str] = {}
        for line in marks.read_text().splitlines():
            mark, sha = line.split()
            result[mark] = sha
        return result


@dataclass(frozen=True)
class CommitObject:
    tree: str
    parents: tuple[str, ...]
    author: str  # raw header value: "Name <email> epoch +zone"
    committer: str
    message: str


def read_commit(repo: Path, sha: str) -> CommitObject:
    raw = run(repo, ["cat-file", "commit", sha]).out
    header, _, message = raw.partition("\n\n")
    tree, author, committer, parents = "", "", "", []
    for line in header.splitlines():
        key, _, value = line.partition(" ")
        if key == "tree":
            tree = value
        elif key == "parent":
            parents.append(value)
        elif key == "author":
            author = value
        elif key == "committer":
            committer = value
    return CommitObject(tree, tuple(parents), author, committer, message)


def commit_tree(repo: Path, tree: str, parents: Sequence[str], message: str) -> str:
    """A commit object (no ref moves); author and committer come from the user's git config."""
    args = ["commit-tree", tree]
    for parent in parents:
        args += ["-p", parent]
    return run(repo, args, input=message.encode()).out.strip()


def scratch_commit(repo: Path, tree: str, parent: str) -> str:
    """A commit object of `tree` on `parent` that only vpatch's own checks look at (a scratch tree checks it out):
    a fixed identity, so that a user without a git identity can run them too."""
    who = {f"GIT_{role}_{part}": value for role in ("AUTHOR", "COMMITTER")
           for part, value in (("NAME", "vpatch"), ("EMAIL", "vpatch@localhost"))}
    return run(repo, ["commit-tree", tree, "-p", parent], input=b"vpatch scratch\n", env=who).out.strip()


def archive_tar(repo: Path, treeish: str, *paths: str) -> bytes:
    """`paths` of `treeish` (all of it when none) as a tar archive."""
    return run(repo, ["archive", "--format=tar", treeish, "--", *paths]).stdout
