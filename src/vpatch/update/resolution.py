"""What a person writes at a stopped update, never lost, and the conflict shown with upstream's side.

A resolution is set aside in the project's git dir (`.git/vpatch-resolutions/NNNN-slug/`: the diff, the files,
where it was made) by `--abort` and before a hand-edited patch replaces it, and replayed when an update stops
at the same patch again: git rerere's idea (record the resolution, reuse it where the same conflict comes
back), kept beside the project rather than in the upstream mirror that every project of the machine shares.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch import git
from vpatch.base import GitError, atomic_write
from vpatch.series import Patch
from vpatch.update.narrow import with_last_update

if TYPE_CHECKING:
    from vpatch.update.journal import Project

RESOLUTIONS_DIR = "vpatch-resolutions"
DIFF_FILE = "resolution.diff"
_MARKS = ("<<<<<<< ", "=======", ">>>>>>> ", "||||||| ")
_PR = re.compile(r"\(#(\d+)\)")


@dataclass(frozen=True)
class Kept:
    """A resolution set aside: `folder` holds `resolution.diff` (on the update tree's last committed patch) and
    the resolved files under `files/`."""

    file: str  # the patch it resolves
    folder: Path
    to_ref: str  # where it was made
    paths: tuple[str, ...]
    unresolved: bool  # conflict markers were still in it: kept, never replayed

    @property
    def diff(self) -> Path:
        return self.folder / DIFF_FILE

    def what(self) -> str:
        what = "your work in progress (conflict markers left in it)" if self.unresolved else "your resolution"
        return f"{what} of {self.file} ({', '.join(self.paths)})"

    def words(self) -> str:
        return f"{self.what()} is kept in {self.folder} ({DIFF_FILE} and files/)"


def folder_of(project: Project, file: str) -> Path:
    return project.git_dir / RESOLUTIONS_DIR / file.removesuffix(".patch")


def keep(project: Project, file: str, tip: str, to_ref: str) -> Kept | None:
    """Set aside what the update tree holds beyond its last committed patch `tip` (the person's work on `file`);
    None when it holds nothing."""
    tree = project.tree
    if not tree.is_dir():
        return None
    git.stage_all(tree)
    diff = git.staged_diff(tree, tip)
    if not diff.strip():
        return None
    paths = tuple(git.staged_paths(tree, tip))
    folder = folder_of(project, file)
    unresolved = has_markers(diff)
    atomic_write(folder / DIFF_FILE, diff)
    for path in paths:
        source = tree / path
        if source.is_file():
            atomic_write(folder / "files" / path, source.read_bytes())
    about = {"file": file, "to_ref": to_ref, "paths": list(paths), "unresolved": unresolved,
             "kept": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    atomic_write(folder / "about.json", (json.dumps(about, indent=2) + "\n").encode())
    return Kept(file, folder, to_ref, paths, unresolved)


def has_markers(diff: bytes) -> bool:
    """Whether `diff` adds conflict marker lines: work in progress, not a resolution."""
    return any(line[1:].startswith(_MARKS) for line in diff.decode("utf-8", "replace").splitlines()
               if line.startswith("+"))


def kept(project: Project, file: str) -> Kept | None:
    """The resolution of `file` set aside earlier, or None."""
    folder = folder_of(project, file)
    try:
        about = json.loads((folder / "about.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (folder / DIFF_FILE).is_file():
        return None
    return Kept(file, folder, str(about.get("to_ref", "?")), tuple(about.get("paths", ())),
                bool(about.get("unresolved", False)))


def replay(project: Project, file: str) -> Kept | None:
    """Put the resolution of `file` set aside earlier into the update tree (staged), when it applies there as
    it is; the tree must hold the last committed patch and nothing else. None when there is none or it does not
    apply (the tree is left as it was)."""
    found = kept(project, file)
    if found is None or found.unresolved:
        return None
    if git.apply_to_worktree(project.tree, found.diff.read_bytes()).returncode != 0:
        return None
    return found


def forget(project: Project, files: Sequence[str]) -> None:
    """The resolutions of `files` are in the project's commit now: their copies go."""
    for file in files:
        folder = folder_of(project, file)
        if folder.is_dir():
            for entry in sorted(folder.rglob("*"), reverse=True):
                entry.rmdir() if entry.is_dir() else entry.unlink()
            folder.rmdir()


# --- the conflict, shown with upstream's side ----------------------------------------------------------------


def label_conflicts(tree: Path, paths: Sequence[str], *, ours: str, theirs: str) -> None:
    """Name the sides of git's `ours` / `theirs` conflict markers: the target, and the patch."""
    for path in paths:
        file = tree / path
        if not file.is_file():
            continue
        data = file.read_bytes()
        labelled = re.sub(rb"(?m)^<<<<<<< ours$", b"<<<<<<< " + ours.encode(), data)
        labelled = re.sub(rb"(?m)^>>>>>>> theirs$", b">>>>>>> " + theirs.encode(), labelled)
        if labelled != data:
            atomic_write(file, labelled)


def upstream_side(repo: Path, tree: Path, paths: Sequence[str], base: str, target: str) -> list[str]:
    """The upstream commits between `base` and `target` that changed the lines in conflict (each conflict's
    target side, and the lines next to it), newest first: `12-digit id subject (PR #N)`."""
    ranges = [r for path in paths for r in _target_ranges(tree / path, path)]
    try:
        records = git.line_log(repo, base, target, ranges)
    except GitError:
        return []  # a path upstream does not have at `target` (the patch adds it): no upstream side to show
    lines = []
    for rec in records:
        pr = _PR.search(rec.subject)
        lines.append(f"{rec.commit[:12]} {rec.subject}" + (f" (PR #{pr[1]})" if pr else ""))
    return lines


def _target_ranges(file: Path, path: str, context: int = 3) -> list[tuple[str, int, int]]:
    """(path, first, last) in the target's numbering of each conflict's target side, with `context` lines."""
    try:
        lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    ranges, at, side, start = [], 0, "out", 0
    for line in lines:
        if line.startswith("<<<<<<< ") and side == "out":
            side, start = "ours", at + 1
        elif line.startswith("||||||| ") and side == "ours":
            side = "base"
            ranges.append((start, at))
        elif line == "=======" and side in ("ours", "base"):
            if side == "ours":
                ranges.append((start, at))
            side = "theirs"
        elif line.startswith(">>>>>>> ") and side == "theirs":
            side = "out"
        elif side in ("out", "ours"):
            at += 1
    return [(path, max(1, first - context), min(at, max(first, last) + context)) for first, last in ranges if at]


# --- the resolved patch, recorded as rewritten by hand -------------------------------------------------------

REWRITTEN = "Rewritten"


def rewritten_by_hand(patch: Patch, to_ref: str, why: str, today: str | None = None) -> Patch:
    """`patch` with `Rewritten: by hand for TO_REF (why)` among its trailers and its Last-Update moved to
    today: a reviewer sees that a person rewrote it, for which release, and why."""
    date = today or datetime.date.today().isoformat()
    start = len(patch.raw) - len(patch.diff)
    head = with_last_update(patch.raw[:start].decode("utf-8", "surrogateescape"), date)
    note = f"{REWRITTEN}: by hand for {to_ref}" + (f" ({why})" if why else "")
    head = re.sub(r"(?m)^Rewritten: .*\n", "", head)  # one such line: the release it was last rewritten for
    head = re.sub(r"(?m)^(Last-Update: )", note.replace("\\", "\\\\") + r"\n\1", head, count=1)
    return Patch.parse(head.encode("utf-8", "surrogateescape") + patch.diff, number=patch.number, slug=patch.slug,
                       path=patch.path)
