"""`git apply --check` (and `--reverse`) done in memory on blobs already read, by git's own matching rules.

Status judges every patch on every target forward and in reverse; with one git process per check that
is most of its time. Here a hunk is placed the way git's apply.c places it: exact byte match of the
preimage, first at the line the hunk names (in the image with the earlier hunks applied), then
alternately one line further and one line back; a hunk that starts at line 0/1 must match at the start,
one without trailing context at the end; no fuzz. Anything outside that simple model - binary diffs,
mode changes, renames, files without hunks - answers UNKNOWN and the caller asks git itself.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from vpatch.series import HUNK_HEADER, FileDiff, Hunk

_LINES = re.compile(rb"[^\n]*\n|[^\n]+\Z")


class ApplyOutcome(str, Enum):
    CLEAN = "clean"
    OFFSETS = "offsets"
    FAILS = "fails"
    UNKNOWN = "unknown"  # outside the model: ask git


@dataclass(frozen=True)
class ApplyCheck:
    outcome: ApplyOutcome
    offsets: tuple[tuple[int, int, int], ...] = ()  # (hunk number in its file, line applied at, offset)
    result: Mapping[str, bytes | None] | None = None  # the files after applying (None: deleted)


@dataclass(frozen=True)
class _Fragment:
    oldpos: int
    newpos: int
    pre: tuple[bytes, ...]
    post: tuple[bytes, ...]
    trailing: int


def check(files: Sequence[FileDiff], blobs: Mapping[str, bytes | None], *, reverse: bool = False) -> ApplyCheck:
    """Whether the diff applies to `blobs` (path -> content, None: absent) as `git apply --check` says."""
    result: dict[str, bytes | None] = {}
    offsets: list[tuple[int, int, int]] = []
    seen: set[str] = set()
    for fd in files:
        if fd.binary or not fd.hunks or any(
            line.startswith((b"old mode", b"new mode", b"rename ", b"copy ", b"similarity"))
            for line in fd.header.splitlines()
        ):
            return ApplyCheck(ApplyOutcome.UNKNOWN)
        old, new = (fd.new_path, fd.old_path) if reverse else (fd.old_path, fd.new_path)
        if old is not None and new is not None and old != new:
            return ApplyCheck(ApplyOutcome.UNKNOWN)
        path = old or new or ""
        if path in seen or path not in blobs:
            return ApplyCheck(ApplyOutcome.UNKNOWN)
        seen.add(path)
        frags = [_fragment(h, reverse) for h in fd.hunks]  # cached: the same hunks are asked about per target
        if any(f is None for f in frags):
            return ApplyCheck(ApplyOutcome.UNKNOWN)
        current = blobs[path]
        if old is None:  # creates the file: it must be absent
            if current is not None:
                return ApplyCheck(ApplyOutcome.FAILS)
            image: list[bytes] = []
        else:
            if current is None:
                return ApplyCheck(ApplyOutcome.FAILS)
            image = list(_split(current))
        for n, frag in enumerate(frags, 1):
            assert frag is not None
            at = _apply(image, frag)
            if at is None:
                return ApplyCheck(ApplyOutcome.FAILS)
            expected = frag.newpos - 1 if frag.newpos else 0
            if at != expected:
                offsets.append((n, at + 1, at - expected))
        if new is None:  # deletes the file: nothing may be left
            if image:
                return ApplyCheck(ApplyOutcome.FAILS)
            result[path] = None
        else:
            result[path] = b"".join(image)
    return ApplyCheck(ApplyOutcome.OFFSETS if offsets else ApplyOutcome.CLEAN, tuple(offsets), result)


@functools.lru_cache(maxsize=64)
def _split(blob: bytes) -> tuple[bytes, ...]:
    return tuple(_LINES.findall(blob))


@functools.lru_cache(maxsize=1024)
def _fragment(hunk: Hunk, reverse: bool) -> _Fragment | None:
    lines = _LINES.findall(hunk.text)
    m = HUNK_HEADER.match(lines[0])
    if m is None:
        return None
    oldpos, newpos = int(m[1]), int(m[3])
    pre: list[bytes] = []
    post: list[bytes] = []
    trailing = 0
    last: tuple[bool, bool] = (False, False)  # whether the previous line went to pre / post
    for line in lines[1:]:
        tag, body = line[:1], line[1:]
        if line == b"\n":
            tag, body = b" ", b"\n"
        if tag == b"\\":
            # "\ No newline at end of file": the line before it has no newline
            if last[0]:
                pre[-1] = pre[-1].removesuffix(b"\n")
            if last[1]:
                post[-1] = post[-1].removesuffix(b"\n")
            continue
        if tag == b" ":
            pre.append(body)
            post.append(body)
            trailing += 1
            last = (True, True)
        elif tag == b"-":
            pre.append(body)
            trailing = 0
            last = (True, False)
        elif tag == b"+":
            post.append(body)
            trailing = 0
            last = (False, True)
        else:
            return None
    if reverse:
        oldpos, newpos, pre, post = newpos, oldpos, post, pre
    return _Fragment(oldpos, newpos, tuple(pre), tuple(post), trailing)


def _apply(image: list[bytes], frag: _Fragment) -> int | None:
    """Place one fragment as apply.c's find_pos does and splice it in; the line it went to, or None."""
    match_beginning = frag.oldpos <= 1
    match_end = frag.trailing == 0
    pre, size = list(frag.pre), len(frag.pre)
    if size > len(image):
        return None
    line = frag.newpos - 1 if frag.newpos else 0
    if match_beginning:
        candidates = [0]
    elif match_end:
        candidates = [len(image) - size]
    elif size == 0:
        candidates = [min(line, len(image))]
    else:
        # Only where the first preimage line occurs, tried in find_pos's order: the named line, then
        # one further, one back, two further, two back, ...
        candidates, at = [], -1
        try:
            while True:
                at = image.index(pre[0], at + 1)
                candidates.append(at)
        except ValueError:
            pass
        candidates.sort(key=lambda c: (abs(c - line), c < line))
    for current in candidates:
        if current < 0 or (match_beginning and current != 0) or (match_end and current + size != len(image)):
            continue
        if image[current:current + size] == pre:
            image[current:current + size] = frag.post
            return current
    return None
