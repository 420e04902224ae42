"""Where the files a patch touches went between its pin and a target, found as `git am -3` finds them.

A touched path present at the pin and missing at a target is looked up with git's rename detection at
git's default similarity (50 %, merge-ort's rename limit), from the pin to the target:

- MOVED: git pairs it with one file of the target (old -> new, similarity), and no other file added
  since the pin matches within `NEAR` points of that one; the patch is judged, applied and exported at
  the new path (`retarget`).
- SPLIT: a second added file matches about as well (within `NEAR` points): not guessed.
- DELETED: no file of the target matches at 50 %: not guessed.

The commit that moved or deleted it is found by bisection on the first-parent line from the pin (or where
the target's branch meets it), and named with the first release carrying it (lineage.first_release: on a
git upstream a cherry-pick on a release branch counts). Everything is kept in the commit-facts cache by
(pin, target, path): rename detection runs once per pair, and only when a touched path is missing.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from vpatch import git
from vpatch.base import Event, Reporter, silent
from vpatch.series import FileDiff, Patch, parse_diff
from vpatch.upstream import commitcache, lineage

SIMILARITY = 50  # git's default rename score (-M, and what a 3-way merge uses)
NEAR = 10  # a second candidate within this many points of git's choice makes the move a split
_FLOOR = 30  # ... but a match below this is no candidate at all
_VERSION = "2"  # bumped whenever what a cached Move holds changes




def first_where(line: Sequence[str], done: Callable[[str], bool]) -> str:
    """The first commit of `line` (oldest first) where `done` holds, by bisection: it holds at the last commit
    and, once it holds, at every later one."""
    lo, hi = 0, len(line) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if done(line[mid]):
            hi = mid
        else:
            lo = mid + 1
    return line[hi]

def where_words(commit: str | None, subject: str | None, release: str | None) -> str:
    """"in 1a2b3c4d5e6f "subject" (release v0.32.0)" - the commit and release that moved a file or its code."""
    if commit is None:
        return ""
    said = f' "{subject}"' if subject else ""
    return f"in {commit[:12]}{said} ({f'release {release}' if release else 'in no release yet'})"

class Fate(str, Enum):
    MOVED = "moved"  # one successor: followed
    SPLIT = "split"  # two or more near-equal successors: a person must choose
    DELETED = "deleted"  # no successor at git's default similarity: a person must look


@dataclass(frozen=True)
class Move:
    old: str
    fate: Fate
    new: str | None = None  # MOVED: the successor
    similarity: int = 0  # MOVED: git's score for old -> new, percent
    candidates: tuple[tuple[str, int], ...] = ()  # SPLIT: every near-equal successor with its score, best first
    commit: str | None = None  # the commit that moved (or deleted) it; None: not found on the line
    subject: str = ""
    release: str | None = None  # the first release carrying `commit`; None: in no release yet
    via: str | None = None  # SPLIT/DELETED: where `commit` itself moved it (a move, then a split or rewrite later)

    @property
    def followed(self) -> bool:
        return self.fate is Fate.MOVED

    def where(self) -> str:
        return where_words(self.commit, self.subject, self.release)

    def __str__(self) -> str:
        if self.fate is Fate.MOVED:
            return self.fate_words()
        person = "choose" if self.fate is Fate.SPLIT else "look"
        return f"{self.fate_words()}; not guessed, a person must {person}"

    def fate_words(self) -> str:
        """What happened to the file, without what a person must do about it (a file whose hunks all followed their
        code needs nothing of them)."""
        where = self.where()
        tail = f", {where}" if where else ""
        if self.fate is Fate.MOVED:
            return f"{self.old} -> {self.new} (similarity {self.similarity}%{tail})"
        at = f" {where}" if where else ""
        later = self.via is not None and self.via not in dict(self.candidates)
        if self.fate is Fate.SPLIT:
            names = ", ".join(f"{path} {score}%" for path, score in self.candidates)
            how = f"moved to {self.via}{at}, later split" if later else f"was split{at}"
            return f"{self.old} {how}: {names} match about equally"
        how = f"moved to {self.via}{at}, and since then" if later else f"was deleted{at} and"
        return f"{self.old} {how} no file matches it at git's {SIMILARITY}% similarity"

    def to_json(self) -> dict[str, Any]:
        return {"old": self.old, "fate": self.fate.value, "new": self.new, "similarity": self.similarity,
                "candidates": [list(c) for c in self.candidates], "commit": self.commit, "subject": self.subject,
                "release": self.release, "via": self.via}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Move:
        return cls(str(data["old"]), Fate(data["fate"]), data.get("new"), int(data.get("similarity", 0)),
                   tuple((str(p), int(s)) for p, s in data.get("candidates", [])), data.get("commit"),
                   str(data.get("subject", "")), data.get("release"), data.get("via"))


def missing_paths(repo: Path, pin: str, commit: str, paths: Sequence[str],
                  at_commit: Mapping[str, bytes | None] | None = None) -> list[str]:
    """The `paths` that are files at `pin` but not at `commit` (the ones a move may explain)."""
    if commit == pin or not paths:
        return []
    here = at_commit if at_commit is not None and all(p in at_commit for p in paths) else \
        git.read_blobs(repo, commit, paths)
    gone = [p for p in paths if here.get(p) is None]
    if not gone:
        return []
    there = git.read_blobs(repo, pin, gone)
    return [p for p in gone if there.get(p) is not None]


def follow(repo: Path, pin: str, commit: str, paths: Collection[str], *, branch: str | None = None,
           describe: bool = True, report: Reporter = silent) -> dict[str, Move]:
    """Where each of `paths` (files at `pin`, missing at `commit`) went: see the module docstring.

    `branch`: a git upstream's main branch (release branches fork from it), for the first release; None on
    the release history. `describe=False` leaves out the moving commit and its release (a bisection step
    needs only the fate and the new path). `report` hears the rename detection (seconds at vLLM's size)."""
    if not paths:
        return {}
    cache = commitcache.store()
    out: dict[str, Move] = {}
    for path in paths:
        cached = cache.get(commit, _field(pin, path))
        if isinstance(cached, dict):
            try:
                out[path] = Move.from_json(cached)
            except (KeyError, TypeError, ValueError):
                pass
    todo = [p for p in paths if p not in out]
    if todo:
        subject = f"moves {pin[:12]}..{commit[:12]}"
        report(Event(subject, f"rename detection for {', '.join(sorted(todo))}"))
        started = time.monotonic()
        changes = git.renames_and_deletions(repo, pin, commit, similarity=SIMILARITY)
        renamed = {c.old: c for c in changes if c.status == "R"}
        added = [c.new for c in changes if c.status == "A" and c.new]
        for path in todo:
            out[path] = _fate(repo, pin, commit, path, renamed.get(path), added)
        report(Event(subject, "done", ", ".join(f"{p}: {out[p].fate.value}" for p in sorted(todo)), final=True,
                     seconds=time.monotonic() - started))
    for path in paths:
        if describe and out[path].commit is None:
            out[path] = _with_commit(repo, pin, commit, out[path], branch)
        if path in todo or (describe and out[path].commit is not None):
            cache.put(commit, _field(pin, path), out[path].to_json())
    cache.flush()
    return out


def _fate(repo: Path, pin: str, commit: str, path: str, rename: git.PathChange | None, added: Sequence[str]) -> Move:
    if rename is None or rename.new is None:
        return Move(path, Fate.DELETED)
    rival = git.best_rename_among(repo, pin, commit, path, [a for a in added if a != rename.new],
                                  similarity=max(_FLOOR, rename.similarity - NEAR))
    if rival is not None and rival.new is not None:
        pairs = sorted([(rename.new, rename.similarity), (rival.new, rival.similarity)], key=lambda c: -c[1])
        return Move(path, Fate.SPLIT, candidates=tuple(pairs))
    return Move(path, Fate.MOVED, rename.new, rename.similarity)


def _with_commit(repo: Path, pin: str, commit: str, move: Move, branch: str | None) -> Move:
    """The first commit on the line from the pin where the old path is gone (bisected), and its release."""
    if git.resolve_commit(repo, commit) is None:
        return move  # a tree (a probe's patched tree): no history to search
    base = pin if commitcache.is_ancestor(repo, pin, commit) else git.merge_base(repo, pin, commit)
    if base is None:
        return move
    line = commitcache.first_parent_commits(repo, base, commit)
    if not line:
        return move

    def gone(sha: str) -> bool:
        return git.read_blobs(repo, sha, [move.old])[move.old] is None

    found = first_where(line, gone)
    subject = commitcache.log_records(repo, None, found, commits=[found])[0].subject
    proof = lineage.first_release(repo, found, branch=branch)
    via = None
    parents = git.parents(repo, found)
    if not move.followed and parents:
        # the commit that took the path away may have moved it, and a later one rewritten or split that file
        there = git.renames_and_deletions(repo, parents[0], found, similarity=SIMILARITY)
        via = next((c.new for c in there if c.status == "R" and c.old == move.old), None)
    return replace(move, commit=found, subject=subject, release=proof.release if proof else None, via=via)


def _field(pin: str, path: str) -> str:
    return "move:" + hashlib.sha256(f"{_VERSION}\0{pin}\0{path}".encode()).hexdigest()[:24]


# --- the patch at the new paths ------------------------------------------------------------------


def retarget(patch: Patch, moves: Mapping[str, Move]) -> Patch:
    """`patch` with every path that moved renamed to its successor in the diff headers (the index lines keep
    the pin's blob ids: they are what a 3-way merge at the new path starts from, as in `git am -3`).
    Unchanged when none of its paths moved."""
    followed = {old: m.new for old, m in moves.items() if m.followed and m.new}
    if not any(p in followed for p in patch.paths):
        return patch
    parts = [_retarget_file(fd, followed) for fd in patch.files]
    diff = b"".join(parts)
    start = len(patch.raw) - len(patch.diff)
    raw = patch.raw[:start] + diff
    return replace(patch, raw=raw, diff=diff, files=parse_diff(diff, where=patch.filename))


def touched(patch: Patch, moves: Mapping[str, Move]) -> list[Move]:
    """The moves among the paths `patch` reads, in its file order."""
    return [moves[fd.old_path] for fd in patch.files if fd.old_path is not None and fd.old_path in moves]


def _retarget_file(fd: FileDiff, followed: Mapping[str, str]) -> bytes:
    old = followed.get(fd.old_path or "", fd.old_path)
    new = followed.get(fd.new_path or "", fd.new_path)
    if (old, new) == (fd.old_path, fd.new_path):
        return fd.text
    lines = fd.header.splitlines(keepends=True)
    out = [b"diff --git " + _quote("a/" + (old or new or "")) + b" " + _quote("b/" + (new or old or "")) + b"\n"]
    for line in lines[1:]:
        if line.startswith(b"--- ") and old is not None and not line.startswith(b"--- /dev/null"):
            line = b"--- " + _quote("a/" + old) + b"\n"
        elif line.startswith(b"+++ ") and new is not None and not line.startswith(b"+++ /dev/null"):
            line = b"+++ " + _quote("b/" + new) + b"\n"
        elif line.startswith((b"rename from ", b"copy from ")) and old is not None:
            line = line.split(b" from ", 1)[0] + b" from " + _quote(old) + b"\n"
        elif line.startswith((b"rename to ", b"copy to ")) and new is not None:
            line = line.split(b" to ", 1)[0] + b" to " + _quote(new) + b"\n"
        out.append(line)
    return b"".join(out) + b"".join(h.text for h in fd.hunks)


def header_path(path: str) -> bytes:
    """A path as git writes it in a diff header (hunkmoves.py writes the header of a file a hunk moved to)."""
    return _quote(path)


def _quote(path: str) -> bytes:
    """A path as git writes it in a diff header: C-quoted when it holds a quote, backslash, control or
    non-ASCII character (core.quotepath=true), plain otherwise."""
    raw = path.encode("utf-8", "surrogateescape")
    if not any(b < 0x20 or b >= 0x7F or b in b'"\\' for b in raw):
        return raw
    escapes = {7: b"\\a", 8: b"\\b", 9: b"\\t", 10: b"\\n", 11: b"\\v", 12: b"\\f", 13: b"\\r", 34: b'\\"', 92: b"\\\\"}
    body = b"".join(escapes.get(b) or (bytes([b]) if 0x20 <= b < 0x7F else b"\\%03o" % b) for b in raw)
    return b'"' + body + b'"'
