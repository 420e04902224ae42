"""What a patch's diff says on one tree: forward, reverse, hunk by hunk, 3-way; read in memory where it can.

The blobs the patches touch are read from the object database (one `cat-file --batch`) and checked by git's
own matching rules (applycheck.py); what that model does not cover (3-way merges, mode changes, binary
diffs) goes to `git apply --cached --check` on a temporary index holding only those paths.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Self

from vpatch import git
from vpatch.series import FileDiff, Patch
from vpatch.series import hunk_name as hunk_name  # noqa: PLC0414 - re-exported: judge and the face name it here
from vpatch.verdict import applycheck
from vpatch.verdict.applycheck import ApplyOutcome


class Applies(str, Enum):
    CLEAN = "clean"
    OFFSETS = "offsets"  # every hunk found its place, some at other line numbers
    THREE_WAY = "3-way"  # only with a 3-way merge, and that merge is clean
    NO = "no"


@dataclass(frozen=True)
class Text:
    """What the diff says on one index: forward, reverse, and hunk by hunk when neither works whole."""

    forward: Applies
    offsets: str
    reverse: bool
    landed: tuple[str, ...] = ()
    needed: tuple[str, ...] = ()
    conflict: tuple[str, ...] = ()
    three_way_tried: bool = False
    three_way_output: str = ""
    # The post-image is in the file but so is the pre-image (see _placed): never a landing by text.
    elsewhere: str = ""  # the pre-image is nearer the hunk's place: the post-image is a copy elsewhere
    ambiguous: tuple[str, ...] = ()  # the post-image is nearer: a person must look (whole diff: "the diff")


_INDEX_MODE = re.compile(rb"^index [0-9a-f]+\.\.[0-9a-f]+ (\d{6})$", re.MULTILINE)


def _blob_id(data: bytes) -> str:

    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


_OFFSET = re.compile(r"Hunk #(\d+) succeeded at (\d+) (?:\(offset (-?\d+) lines?\))?(?: ?\(fuzz (\d+)\))?")


class Tree:
    """The files the patches touch on one commit: checked in memory, with a temporary index (built only
    when first needed) for what memory cannot answer - 3-way merges, mode changes, binary diffs."""

    def __init__(self, repo: Path, commit: str, patches: Sequence[Patch], paths: Sequence[str],
                 blobs: Mapping[str, bytes | None] | None) -> None:
        self.repo, self.commit, self.paths = repo, commit, list(paths)
        self.modes = {fd.path: m[1].decode() for patch in patches for fd in patch.files
                      if (m := _INDEX_MODE.search(fd.header))}
        if blobs is None or any(p not in blobs for p in self.paths):
            blobs = git.read_blobs(repo, commit, self.paths)
        self.blobs: dict[str, bytes | None] = dict(blobs)
        self.original = dict(blobs)
        self.stacked: list[tuple[Patch, bool]] = []
        self.memory = True  # False once a stacked patch went in through git only
        self._stack = ExitStack()
        self._env: Mapping[str, str] | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def index(self) -> Mapping[str, str]:
        if self._env is None:
            env = self._stack.enter_context(git.temp_index(self.repo))
            if len(self.commit) == 40:
                # The blobs are in hand, so their ids are too (SHA-1 repositories): no ls-tree. The mode
                # only feeds git's "has type" warning, so the patch's own index line (or 644) is enough.
                git.add_index_entries(self.repo, env, [(self.modes.get(path, "100644"), _blob_id(data), path)
                                                       for path, data in self.original.items() if data is not None])
            else:
                git.load_index(self.repo, env, self.commit, self.paths)
            for patch, three_way in self.stacked:
                git.apply_cached(self.repo, env, patch.diff, check=False, three_way=three_way)
            self._env = env
        return self._env

    def add_paths(self, paths: Sequence[str]) -> None:
        """Read more of the commit's files (where a hunk's code moved to, hunkmoves.py) into the tree."""
        new = [p for p in paths if p not in self.blobs]
        if not new:
            return
        found = git.read_blobs(self.repo, self.commit, new)
        self.blobs.update(found)
        self.original.update(found)
        self.paths += new
        if self._env is not None:
            git.load_index(self.repo, self._env, self.commit, new)

    def check(self, files: Sequence[FileDiff], diff: bytes, *, reverse: bool = False) -> Placed | None:
        """Where the diff applies (None: it does not)."""
        if self.memory:
            found = applycheck.check(files, self.blobs, reverse=reverse)
            if found.outcome is not ApplyOutcome.UNKNOWN:
                return None if found.outcome is ApplyOutcome.FAILS else Placed(found.offsets)
        result = git.apply_cached(self.repo, self.index(), diff, reverse=reverse)
        if result.returncode != 0:
            return None
        return Placed(tuple((int(m[1]), int(m[2]), int(m[3] or 0)) for m in _OFFSET.finditer(result.err)))

    def three_way_clean(self, patch: Patch) -> tuple[bool, str]:
        three = git.apply_cached(self.repo, self.index(), patch.diff, three_way=True)
        return three.returncode == 0 and "with conflicts" not in three.err, three.err

    def apply(self, patch: Patch, *, three_way: bool) -> None:
        """Stack a needed patch under the later ones that share its files."""
        found = applycheck.check(patch.files, self.blobs) if self.memory and not three_way else None
        if found is not None and found.result is not None and found.outcome is not ApplyOutcome.FAILS:
            self.blobs.update(found.result)
        else:
            self.memory = False
        if self._env is not None:
            git.apply_cached(self.repo, self._env, patch.diff, check=False, three_way=three_way)
        self.stacked.append((patch, three_way))


@dataclass(frozen=True)
class Placed:
    """Where a diff went: (hunk number in its file, line, offset) for every hunk not at its named line."""

    offsets: tuple[tuple[int, int, int], ...]

    @property
    def distance(self) -> int:
        return sum(abs(off) for _, _, off in self.offsets)

    def __str__(self) -> str:
        return ", ".join(f"hunk {n} at line {line}" + (f" ({off:+d})" if off else "") for n, line, off in self.offsets)


def _both_ways(forward: Placed, reverse: Placed) -> str:
    """How far each image is from where the hunks belong, for the evidence."""
    return (f"its pre-image at {forward or 'the named lines'}, its post-image at {reverse or 'the named lines'}")


def read(tree: Tree, patch: Patch) -> Text:
    # Both directions search the whole file (git's own rule), so a post-image can be "found" in a copy of
    # the code far from where the hunk belongs. The rule: reverse-apply is landing evidence only where the
    # forward application fails. Where both work, the file holds both images and text cannot say which is
    # the hunk's own place: the one nearer the hunk's line numbers is taken as its place (pre-image nearer
    # or as near: needed, the post-image is a copy elsewhere; post-image nearer: ambiguous, a person must
    # look). Moved code keeps working: its pre-image is gone, so forward fails and the reverse stands.
    forward = tree.check(patch.files, patch.diff)
    reverse = tree.check(patch.files, patch.diff, reverse=True)
    if forward is not None:
        applies = Applies.OFFSETS if forward.offsets else Applies.CLEAN
        if reverse is None:
            return Text(applies, str(forward), False)
        if forward.distance <= reverse.distance:
            return Text(applies, str(forward), False, elsewhere=_both_ways(forward, reverse))
        return Text(applies, str(forward), False, ambiguous=(f"the diff ({_both_ways(forward, reverse)})",))
    by_hunk = _by_hunk(tree, patch)
    if reverse is not None and not (by_hunk.needed or by_hunk.ambiguous):
        return Text(Applies.NO, "", True)
    # Neither direction works whole (or the whole reverse found some hunk's post-image while that hunk's
    # pre-image is in the file too): hunk by hunk, and later whether a 3-way merge would be clean.
    return by_hunk


def _by_hunk(tree: Tree, patch: Patch) -> Text:
    landed, needed, conflict, ambiguous, elsewhere = [], [], [], [], []
    for fd in patch.files:
        for n, hunk in enumerate(fd.hunks, 1):
            name = hunk_name(fd, n, hunk)
            one = (replace(fd, hunks=(hunk,)),)
            mini = fd.header + hunk.text
            back, ahead = tree.check(one, mini, reverse=True), tree.check(one, mini)
            if back is not None and ahead is None:
                landed.append(name)
            elif back is not None and ahead is not None and back.distance < ahead.distance:
                ambiguous.append(f"{name} ({_both_ways(ahead, back)})")
            elif ahead is not None:
                needed.append(name)
                if back is not None:
                    elsewhere.append(f"{name}: {_both_ways(ahead, back)}")
            else:
                conflict.append(name)
    return Text(Applies.NO, "", False, tuple(landed), tuple(needed), tuple(conflict),
                 elsewhere="; ".join(elsewhere), ambiguous=tuple(ambiguous))


def with_three_way(tree: Tree, patch: Patch, text: Text) -> Text:
    clean, output = tree.three_way_clean(patch)
    return replace(text, forward=Applies.THREE_WAY if clean else Applies.NO, three_way_tried=True,
                   three_way_output=output)


