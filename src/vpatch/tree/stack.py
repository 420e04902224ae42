"""The applied tree: the series applied onto a ref as one commit per patch, and its record (export.py writes the
commits back to the files)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vpatch import git
from vpatch.base import ApplyError, VpatchError, load_record, save_record
from vpatch.series import Patch, Series
from vpatch.upstream import (
    Move,
    follow_file_moves,
    hunk_lost,
    hunk_placements,
    hunks_to_find,
    missing_paths,
    moves_read_by,
    relocate_hunks,
    relocated_patch,
    retarget_paths,
)

# Each applied commit carries the file it came from, so export maps commits back to stable numbers
# even after amends and reorders; export strips the line again.
MARKER = "Vpatch-File"
_MARKER_LINE = re.compile(rb"^Vpatch-File: (\S+)\n", re.M)
STATE_FILE = "tree.json"


@dataclass(frozen=True)
class AppliedPatch:
    file: str
    commit: str
    # sha256 of the patch file as vpatch last read it (apply) or wrote it (export): a file in patches/ that no
    # longer has it was changed by someone else since, and export must not overwrite it. None in a record of
    # an older vpatch. The update tree's record is not compared: that tree is built from the files as they are.
    digest: str | None = None


@dataclass(frozen=True)
class Stack:
    """A work tree holding base + one commit per patch, as recorded by apply."""

    worktree: Path
    upstream: Path
    ref: str
    base: str
    applied: tuple[AppliedPatch, ...]
    # while an export writes the files: the record it replaces, whose digests the files not written yet still
    # have (an export killed half-way and run again must not take them for hand edits); () once it is done
    pending: tuple[AppliedPatch, ...] = ()

    @property
    def tip(self) -> str:
        return self.applied[-1].commit if self.applied else self.base

    def to_dict(self) -> dict[str, Any]:
        return {
            "worktree": str(self.worktree), "upstream": str(self.upstream), "ref": self.ref,
            "base": self.base, "applied": [_applied_dict(a) for a in self.applied],
            **({"pending": [_applied_dict(a) for a in self.pending]} if self.pending else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Stack:
        for name in ("worktree", "upstream", "ref", "base"):
            if not isinstance(data.get(name), str):
                raise TypeError(f"its {name!r} is missing or not a string")
        applied, pending = data.get("applied"), data.get("pending", [])
        for name, entries in (("applied", applied), ("pending", pending)):
            if not isinstance(entries, list) or not all(
                    isinstance(a, dict) and isinstance(a.get("file"), str) and isinstance(a.get("commit"), str)
                    and isinstance(a.get("sha256", ""), str) for a in entries):
                raise TypeError(f"its {name!r} must be a list of {{file, commit}} strings")
        assert isinstance(applied, list) and isinstance(pending, list)
        return cls(
            worktree=Path(data["worktree"]), upstream=Path(data["upstream"]), ref=data["ref"], base=data["base"],
            applied=tuple(AppliedPatch(a["file"], a["commit"], a.get("sha256")) for a in applied),
            pending=tuple(AppliedPatch(a["file"], a["commit"], a.get("sha256")) for a in pending),
        )


def _applied_dict(a: AppliedPatch) -> dict[str, str]:
    return {"file": a.file, "commit": a.commit, **({"sha256": a.digest} if a.digest else {})}


@dataclass(frozen=True)
class Failure:
    patch: Patch
    files: tuple[str, ...]  # files git named as not applying
    hunks: tuple[str, ...]  # "path: @@ -a,b +c,d @@" of the failing hunks
    three_way_ok: bool
    output: str


def apply_series(
    upstream: Path, series: Series, *, ref: str, base: str, out: Path, state_dir: Path, keep: bool = False,
    force: bool = False, moves_from: str | None = None,
) -> Stack:
    """Make `out` a work tree of `base` with each patch committed; all or nothing unless `keep`.

    `moves_from`: the commit the patches were written on (the pin); a file they read that is missing on `base`
    is followed where upstream moved it (moves.py), so the commit, and what `export` writes, names the new path."""
    original = series
    digests = {p.filename: p.sha256 for p in original}
    found: dict[str, Move] = {}
    if moves_from is not None and moves_from != base:
        series, found = _following_moves(upstream, series, moves_from, base)
    _prepare_out(upstream, original, out, state_dir, force=force)
    tmp = out.parent / f".{out.name}.partial"
    # a killed apply, or a state folder deleted by hand, leaves registrations (maybe locked) of both paths
    shutil.rmtree(tmp, ignore_errors=True)
    git.forget_worktrees(upstream, tmp, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    git.add_worktree(upstream, tmp, base)
    applied: list[AppliedPatch] = []
    by_name = {p.filename: p for p in original}
    try:
        for patch in series:
            failure = _apply_one(tmp, patch)
            if failure is not None and moves_from is not None and moves_from != base:
                # hunks whose code upstream moved to another file go where it went, when one place is clear
                moved = _following_code(upstream, by_name[patch.filename], patch, tmp, moves_from, base, found)
                if moved is not None and _apply_one(tmp, moved) is None:
                    patch, failure = moved, None
            if failure is not None:
                if keep:
                    save_stack(state_dir, Stack(out.resolve(), upstream, ref, base, tuple(applied)))
                    git.move_worktree(upstream, tmp, out)
                raise _apply_error(failure, ref=ref, kept=out if keep else None,
                                   unfollowed=[m for m in moves_read_by(patch, found) if not m.followed])
            # the digest of the file as read, not of the patch as applied (which may follow a move)
            applied.append(AppliedPatch(patch.filename, git.head(tmp), digests.get(patch.filename)))
    except BaseException:
        if git.is_repo(tmp):
            git.remove_worktree(upstream, tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # The record first: a kill before the move leaves a record of a missing tree (apply makes it again),
    # never a tree without a record (which the next apply would refuse to replace).
    stack = Stack(out.resolve(), upstream, ref, base, tuple(applied))
    save_stack(state_dir, stack)
    git.move_worktree(upstream, tmp, out)
    return stack


def _following_moves(upstream: Path, series: Series, pin: str, base: str) -> tuple[Series, dict[str, Move]]:
    """The series at the paths its files moved to on `base`, and every move found (deleted and split files
    too: they are not followed, and a patch failing on one is told why)."""
    reads = sorted({fd.old_path for patch in series for fd in patch.files if fd.old_path})
    found = dict(follow_file_moves(upstream, pin, base, missing_paths(upstream, pin, base, reads)))
    if not found:
        return series, found
    return replace(series, patches=tuple(retarget_paths(p, found) for p in series)), found


def _following_code(upstream: Path, original: Patch, patch: Patch, tree: Path, pin: str, base: str,
                    found: dict[str, Move]) -> Patch | None:
    """`patch` with each hunk that is not in its file on the tree (neither image) moved to where its code went on
    `base` (hunkmoves.py: one clear place), or None when no hunk has such a place."""

    blobs = {fd.path: _read(tree / fd.path) for fd in patch.files}
    asks = hunks_to_find(original, patch, lambda fd, n, hunk: hunk_lost(fd, n, hunk, blobs), found)
    placements = hunk_placements(relocate_hunks(upstream, pin, base, asks, describe=False))
    return relocated_patch(original, patch, placements) if placements else None


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes() if path.is_file() else None
    except OSError:
        return None


def commit_patch(worktree: Path, patch: Patch) -> None:
    """Commit the index as `patch`: its author, date and message, plus the marker trailer."""
    info = git.mailinfo(patch.raw)
    message = info.subject + "\n"
    if info.body.strip():
        message += "\n" + info.body.rstrip("\n") + "\n"
    if patch.trailers:
        message += f"{MARKER}: {patch.filename}\n"
    else:
        message += f"\n{MARKER}: {patch.filename}\n"
    author = info.author
    git.commit_index(worktree, message, author)


def _apply_one(worktree: Path, patch: Patch) -> Failure | None:
    result = git.apply_to_worktree(worktree, patch.diff)
    if result.returncode == 0:
        commit_patch(worktree, patch)
        return None
    # --check cannot tell a clean 3-way merge from one with conflicts, so try it for real and undo it
    three_way = git.apply_to_worktree(worktree, patch.diff, three_way=True).returncode == 0
    git.discard_changes(worktree)
    return describe_failure(patch, result.err, three_way)


def describe_failure(patch: Patch, stderr: str, three_way_ok: bool) -> Failure:
    """Name the files and hunks git could not apply, from its own messages."""
    files: dict[str, None] = {}
    hunks: list[str] = []
    for m in re.finditer(r"error: patch failed: (.+):(\d+)", stderr):
        path, line = m[1], int(m[2])
        files[path] = None
        for fd in patch.files:
            if fd.path != path and fd.old_path != path:
                continue
            for n, hunk in enumerate(fd.hunks, 1):
                if int(hunk.header.split()[1].lstrip("-").split(",")[0]) == line:
                    hunks.append(f"{path} hunk {n} ({hunk.header.split(' @@')[0]} @@)")
    reasons = r"does not exist in index|already exists in (?:index|working directory)|No such file or directory|patch does not apply"
    for m in re.finditer(rf"error: (.+?): ({reasons})", stderr):
        files[m[1]] = None
        if m[2] != "patch does not apply":
            hunks.append(f"{m[1]}: {m[2]}")
    return Failure(patch, tuple(files), tuple(dict.fromkeys(hunks)), three_way_ok, stderr.strip())


def _apply_error(failure: Failure, *, ref: str, kept: Path | None, unfollowed: Sequence[Move] = ()) -> ApplyError:
    where = "; ".join(failure.hunks) or ", ".join(failure.files) or "see git's output below"
    msg = f"patch {failure.patch.filename} does not apply to {ref}: {where}"
    # a file it changes is gone from ref and was not followed: say where it went, or that nobody can tell
    msg += "".join(f"\na file it changes is not on {ref}: {move}" for move in unfollowed)
    msg += "\n" + ("a 3-way apply would succeed (the change merges with upstream's edits)"
                   if failure.three_way_ok else "a 3-way apply would not succeed either")
    msg += "\n" + failure.output
    if kept is not None:
        hint = (f"the tree is kept at {kept} with the patches before it committed; apply the patch by hand "
                f"(git -C {kept} apply --3way {failure.patch.path}), commit it, then `vpatch export`")
    else:
        hint = f"vpatch apply --ref {ref} --keep to get a tree holding the patches before it, to fix it there"
    return ApplyError(msg, hint=hint)


def _prepare_out(upstream: Path, series: Series, out: Path, state_dir: Path, *, force: bool) -> None:
    """Clear the way for a new tree at `out`: refuse while any tree vpatch applied (the recorded one, wherever it
    is, or a leftover at `out`) holds work not yet exported, unless forced; remove those trees and their
    registrations in the upstream repository, so that nothing is stranded and nothing blocks the next apply."""
    try:
        stack = load_stack(state_dir, required=False)
    except VpatchError:
        if not force:
            raise
        # The record is unreadable, so nothing tells what the tree holds; --force was asked to throw it away.
        stack = None
        (state_dir / STATE_FILE).unlink()
    if stack is not None and _is_tree_of(stack.upstream, stack.worktree):
        if not force:
            _refuse_unexported(stack.worktree, _recorded_work(stack))
        _remove_tree(stack.upstream, stack.worktree)
    elif stack is not None:
        git.forget_worktrees(stack.upstream, stack.worktree)  # gone, or something else now: only its registration
    if not out.exists():
        return
    if not out.is_dir():
        raise VpatchError(f"{out} exists and is not a folder", hint="choose another --out (a new or empty folder)")
    if _is_tree_of(upstream, out):
        # applied by vpatch but no longer recorded (a record replaced or deleted by an older vpatch, or a kill)
        if not force:
            _refuse_unexported(out, _leftover_work(out, series))
        _remove_tree(upstream, out)
        return
    if any(out.iterdir()):
        raise VpatchError(f"{out} exists and is not a vpatch tree", hint="choose another --out, or remove it")
    out.rmdir()


def _recorded_work(stack: Stack) -> str | None:
    """What the recorded tree holds that export has not written, in words; None when nothing."""
    tree = stack.worktree
    if git.dirty_paths(tree):
        return "uncommitted changes"
    return "new or edited commits" if git.head(tree) != stack.tip else None


def _leftover_work(tree: Path, series: Series) -> str | None:
    """The same for a tree no record describes: its own commits must each export to a series file as it is."""
    if git.dirty_paths(tree):
        return "uncommitted changes"
    files = {p.filename: p.raw for p in series}
    for commit in git.local_commits(tree):
        name, raw = strip_marker(git.format_patch(tree, commit))
        if name is None or files.get(name) != raw:
            return f"commit {commit[:12]}, which is not in {series.directory.name}/ as it is"
    return None


def _refuse_unexported(tree: Path, work: str | None) -> None:
    if work is not None:
        raise VpatchError(f"{tree} holds work that is not exported ({work})",
                          hint=f"vpatch export first (it exports from {tree}), or pass --force to throw that work away")


def _is_tree_of(upstream: Path, path: Path) -> bool:
    """Whether `path` is a work tree of the upstream repository (its own .git file points into it)."""
    if not (path / ".git").is_file() or not git.is_repo(path):
        return False
    return git.git_dir(path).resolve().is_relative_to(upstream.resolve())


def _remove_tree(upstream: Path, tree: Path) -> None:
    """Delete a tree vpatch applied and forget its registration (also when the folder is gone already)."""
    shutil.rmtree(tree, ignore_errors=True)
    git.forget_worktrees(upstream, tree)


def save_stack(state_dir: Path, stack: Stack) -> None:
    """Write the record of the applied tree (a `records` journal: atomic, fsynced)."""
    save_record(state_dir / STATE_FILE, stack)


def load_stack(state_dir: Path, *, required: bool = True) -> Stack | None:
    """The record of the applied tree; None (or, when `required`, an error) when there is none, and a
    JournalError naming the file when it is unreadable."""
    path = state_dir / STATE_FILE
    stack = load_record(path, Stack.from_dict, what="the record of the applied tree",
                         hint="save any work in that tree with git format-patch, then vpatch apply --force to rebuild it",
                         ) if path.is_file() else None
    if stack is None and required:
        raise VpatchError("no applied tree to export from", hint="vpatch apply first, edit the commits there, then vpatch export")
    return stack


def strip_marker(raw: bytes) -> tuple[str | None, bytes]:
    """Remove the marker trailer from the message part; return the file it names."""
    diff_at = raw.find(b"\ndiff --git ")
    head, diff = (raw[:diff_at + 1], raw[diff_at + 1:]) if diff_at >= 0 else (raw, b"")
    markers = list(_MARKER_LINE.finditer(head))
    m = markers[-1] if markers else None  # the last one counts: vpatch writes its marker last
    if m is None:
        return None, raw
    name = m[1].decode()
    before, after = head[:m.start()], head[m.end():]
    if before.endswith(b"\n\n") and after.startswith(b"\n"):
        before = before[:-1]  # the marker was a paragraph of its own: drop its blank line too
    return name, before + after + diff
