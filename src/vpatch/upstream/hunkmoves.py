"""Where a hunk's code went when git's file pairing cannot say: a file cut into pieces, code moved between files.

moves.py follows a file the way `git am -3` does, as one file. A hunk is searched for on its own only when it
needs it: it neither applies nor reverse-applies where the patch puts it (its own file, the file git pairs that
with, or nowhere: a file deleted or split). Then:

- **Candidates**: the files git's split detection named for its file (moves.Move), and every file of the target
  holding one of the hunk's most telling lines (`git grep -F` of its longest pre-image lines, and of its longest
  added lines, so that upstream's own change found at a new place is a candidate too), whitespace around them
  ignored.
- **Score**, per candidate, of the pre-image (the patch applies there) and of the post-image (the change is there
  already): the whole image exactly (100) or with whitespace ignored (90), else its lines found in order around
  their longest run (at most 80); 80 % of a score is the image, 20 % its surroundings: the lines around the hunk in the pin's
  file found around the place.
- **Clear winner**: one file holds the whole image at one place, scores `CLEAR` or more, and leads every other
  candidate by `LEAD` points. The hunk is re-targeted there (`relocated`): a patch whose hunks went to two files
  becomes a patch on two files.
- **Otherwise a person is asked** (never a guess): the whole image in two files (duplicated code), or at two
  places of one, the change found done elsewhere while the hunk's own file stands (a copy may have it, the file
  the patch fixes not), or only weak matches (`WEAK` or more) - each candidate named with its score.
- **Nothing is said** when the hunk's own file still holds much of it (`WEAK` or more): the code did not leave,
  upstream changed it there; nor when that file stands and other files hold only pieces of the hunk (related
  code, not the hunk's). The hunk is judged where it is, as before (a 3-way merge included).
- **A copy is not a move**: a file that held the image already at the pin (vLLM keeps per-vendor copies of a
  model's code) is no candidate: the code did not go there.

Answers are kept in the commit-facts cache by (pin, target, path, hunk, where it was put); the commit that took
the code away from where the pin had it is found by bisection and named with its first release, as for a move.
"""

from __future__ import annotations

import difflib
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from vpatch import git
from vpatch.base import Event, Reporter, silent
from vpatch.series import HUNK_HEADER, FileDiff, Hunk, Patch, parse_diff
from vpatch.upstream import commitcache, lineage, mirror, moves

CLEAR = 80  # a winner's score at least (the whole image exactly, or with whitespace and most surroundings)
LEAD = 10  # ... and this many points above every other candidate
WEAK = 50  # a candidate scoring less is not named at all
_SURROUND = 6  # non-blank lines each side of the hunk compared with the place's surroundings
_NEEDLES = 4  # pre-image lines searched for (the longest), plus half as many added lines
_MIN_NEEDLE = 12  # characters: shorter lines (`return x`, `)`) say nothing about where code is
_MAX_FILES = 25  # the files holding most of the needles are scored
_QUIET = 0.5  # seconds: a search this quick is not reported
_VERSION = "8"  # bumped whenever what a cached HunkMove holds changes


@dataclass(frozen=True)
class HunkPlace:
    """One candidate for a hunk's code: a file of the target and how well it holds the hunk."""

    path: str
    score: int
    line: int = 0  # 1-based line where the image starts (0: not whole)
    image: str = "pre"  # "pre": the code the patch changes is there; "post": the patch's result is there
    exact: bool = True  # False: found only with whitespace ignored
    whole: bool = False  # the whole image, contiguous
    count: int = 1  # how many places of that file hold the whole image

    def __str__(self) -> str:
        how = "" if not self.whole else (" (already changed)" if self.image == "post" else "") + (
            "" if self.exact else " (whitespace differs)") + (f" at {self.count} places" if self.count > 1 else "")
        return f"{self.path} {self.score}%{how}"


@dataclass(frozen=True)
class HunkMove:
    old: str  # the path the patch names (at the pin)
    hunk: int  # the hunk's number in that file, 1-based
    header: str  # its "@@ -a,b +c,d @@" line
    at: str  # where it was put before the search (its file, or where git pairs that with)
    candidates: tuple[HunkPlace, ...] = ()  # WEAK or better, best first
    new: str | None = None  # the clear winner: the hunk is re-targeted there
    commit: str | None = None  # the commit that took the code away from where the pin had it
    subject: str = ""
    release: str | None = None

    @property
    def followed(self) -> bool:
        return self.new is not None

    @property
    def winner(self) -> HunkPlace | None:
        return self.candidates[0] if self.new is not None else None

    def name(self) -> str:
        return f"{self.old} hunk {self.hunk} ({self.header.split(' @@')[0]} @@)"

    def where(self) -> str:
        return moves.where_words(self.commit, self.subject, self.release)

    def __str__(self) -> str:
        where = self.where()
        tail = f", the code moved {where}" if where else ""
        if self.winner is not None:
            return f"{self.name()} -> {self.new} line {self.winner.line} (score {self.winner.score}%{tail})"
        names = ", ".join(str(c) for c in self.candidates)
        return (f"{self.name()}: its code is not where git puts the file; candidates {names}{tail}: no clear "
                "winner, not guessed, a person must choose")

    def to_json(self) -> dict[str, Any]:
        return {"old": self.old, "hunk": self.hunk, "header": self.header, "at": self.at, "new": self.new,
                "candidates": [c.__dict__ for c in self.candidates], "commit": self.commit,
                "subject": self.subject, "release": self.release}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HunkMove:
        return cls(str(data["old"]), int(data["hunk"]), str(data["header"]), str(data["at"]),
                   tuple(HunkPlace(**c) for c in data.get("candidates", ())), data.get("new"), data.get("commit"),
                   str(data.get("subject", "")), data.get("release"))


@dataclass(frozen=True)
class Ask:
    """One hunk to search for: its file at the pin, its number there, and where the patch put it."""

    old: str
    number: int
    hunk: Hunk
    at: str
    hints: tuple[str, ...] = ()  # git's split candidates for its file
    via: str | None = None  # where git's pairing took its file before a later split or rewrite (moves.Move.via)


def asks(original: Patch, current: Patch, wanted: Callable[[FileDiff, int, Hunk], bool],
         file_moves: Mapping[str, moves.Move]) -> list[Ask]:
    """The hunks of `current` (the patch after following file moves) that are `wanted` (the verdict's: those that
    neither apply nor reverse-apply), as questions; only changes to a file that stays a file qualify."""
    out = []
    for fd, was in zip(current.files, original.files, strict=True):
        if fd.old_path is None or fd.new_path is None or fd.binary or was.old_path is None:
            continue
        move = file_moves.get(was.old_path)
        hints = () if move is None else tuple(
            p for p in (move.new, move.via, *(c for c, _ in move.candidates)) if p is not None)
        for n, hunk in enumerate(fd.hunks, 1):
            pre, _ = _images(hunk)
            if pre and wanted(fd, n, hunk):
                out.append(Ask(was.old_path, n, hunk, fd.path, hints, move.via if move is not None else None))
    return out


def lost(fd: FileDiff, n: int, hunk: Hunk, blobs: Mapping[str, bytes | None]) -> bool:
    """Whether neither the hunk's pre-image nor its post-image is in its file (`blobs`: path -> content), exactly:
    the test for a tree no verdict read (`apply --ref`), where git's own apply just failed."""
    blob = blobs.get(fd.path)
    if blob is None:
        return True
    lines = blob.splitlines()
    pre, post = _images(hunk)
    return not _positions(lines, list(pre)) and not (post and _positions(lines, list(post)))


def relocate(repo: Path, pin: str, commit: str, questions: Sequence[Ask], *, describe: bool = True,
             branch: str | None = None, report: Reporter = silent) -> dict[tuple[str, int], HunkMove]:
    """(old path, hunk number) -> where each asked hunk's code is on `commit` (see the module docstring)."""
    if not questions:
        return {}
    cache = commitcache.store()
    out: dict[tuple[str, int], HunkMove] = {}
    todo: list[Ask] = []
    for ask in questions:
        cached = cache.get(commit, _field(pin, ask))
        try:
            # the same hunk text may be another number in another patch: the answer is about the text
            out[(ask.old, ask.number)] = replace(HunkMove.from_json(cached), hunk=ask.number, header=ask.hunk.header)
        except (KeyError, TypeError, ValueError, AttributeError):
            todo.append(ask)
    if todo:
        subject, started = f"hunk moves {pin[:12]}..{commit[:12]}", time.monotonic()
        pins = git.read_blobs(repo, pin, sorted({a.old for a in todo}))
        needles = {id(a): _needles(*_images(a.hunk)) for a in todo}
        # code moves between files of its kind: a Python hunk is looked for in Python files
        suffixes = sorted({PurePosixPath(a.old).suffix for a in todo})
        # a partial mirror lacks most of the tree's blobs: git grep would fetch them one by one, this asks once
        mirror.prefetch_tree(repo, commit, report=report)
        holding = git.files_containing(repo, commit, sorted({x for n in needles.values() for x in n}),
                                       suffixes=suffixes if all(suffixes) else ())
        for ask in todo:
            mine = set(needles[id(ask)])
            found = {path: len(held & mine) for path, held in holding.items() if held & mine}
            out[(ask.old, ask.number)] = _search(repo, pin, commit, ask, pins.get(ask.old), found)
        seconds = time.monotonic() - started
        if seconds > _QUIET:  # said once it took a while (one grep of vLLM's tree); a toy tree's search stays quiet
            report(Event(subject, "searched where " + ", ".join(f"{a.old} hunk {a.number}" for a in todo) + " went",
                         final=True, seconds=seconds))
    for ask in questions:
        key = (ask.old, ask.number)
        if describe and out[key].commit is None and out[key].candidates:
            out[key] = _with_commit(repo, pin, commit, ask, out[key], branch)
        if ask in todo or (describe and out[key].commit is not None):
            cache.put(commit, _field(pin, ask), out[key].to_json())
    cache.flush()
    return out


def _search(repo: Path, pin: str, commit: str, ask: Ask, at_pin: bytes | None, found: Mapping[str, int]) -> HunkMove:
    """`found`: path -> how many of the hunk's telling lines the file holds (one grep for every hunk asked)."""
    pre, post = _images(ask.hunk)
    before, after = _surroundings(ask.hunk, at_pin, len(pre))
    named = sorted(found, key=lambda p: (-found[p], p))[:_MAX_FILES]
    paths = sorted({*named, *ask.hints, ask.at, ask.old})
    blobs = git.read_blobs(repo, commit, paths)
    places = [_score(path, blob, pre, post, before, after) for path, blob in blobs.items() if blob is not None]
    places = sorted((p for p in places if p.score >= WEAK), key=lambda p: (-p.score, p.path))
    # Code that was already there at the pin is a copy, not where it went (vLLM keeps per-vendor copies of a
    # model: a fix to one must never be read as belonging in another): only a file that gained it counts.
    had = git.read_blobs(repo, pin, [p.path for p in places if p.whole and p.path != ask.at])
    places = [p for p in places if not (p.path in had and _held(had[p.path], pre if p.image == "pre" else post, p.exact))]
    move = HunkMove(ask.old, ask.number, ask.hunk.header, ask.at, tuple(places))
    stands = blobs.get(ask.at) is not None
    if not places or any(p.path == ask.at for p in places) or (stands and not any(p.whole for p in places)):
        # nothing elsewhere; or its own file still holds much of it (the code did not leave, upstream changed it
        # there); or that file stands and other files hold only pieces (related code, not the hunk's): the hunk
        # is judged where it is, as before - 3-way merge included
        return replace(move, candidates=())
    best, rest = places[0], places[1:]
    whole = [p for p in places if p.whole]
    # a clear winner: the only file holding the whole image, at one place, well above everything else
    if (best.whole and len(whole) == 1 and best.count == 1 and best.score >= CLEAR
            and all(p.score <= best.score - LEAD for p in rest)
            and not (best.image == "post" and blobs.get(ask.old) is not None)):
        # (the change found done in another file while the hunk's own file stands is no landing to act on: a
        # copy of the code may have had it made while the file the patch fixes did not - a person looks)
        return replace(move, new=best.path)
    return move


def _held(blob: bytes | None, image: Sequence[bytes], exact: bool) -> bool:
    """Whether `blob` (a file at the pin) holds the whole image already (exactly, or with whitespace ignored)."""
    if blob is None or not image:
        return False
    if exact:
        return bool(_positions(blob.splitlines(), list(image)))
    return bool(_positions([_norm(x) for x in blob.splitlines()], [_norm(x) for x in image]))


def _images(hunk: Hunk) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """The hunk's pre-image and post-image lines (newlines dropped)."""
    pre: list[bytes] = []
    post: list[bytes] = []
    for line in hunk.text.splitlines()[1:]:
        tag, body = line[:1], line[1:]
        if tag in (b" ", b""):
            pre.append(body)
            post.append(body)
        elif tag == b"-":
            pre.append(body)
        elif tag == b"+":
            post.append(body)
    return tuple(pre), tuple(post)


def _norm(line: bytes) -> bytes:
    return b" ".join(line.split())


def _surroundings(hunk: Hunk, blob: bytes | None, size: int) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """Up to `_SURROUND` non-blank lines before and after the hunk in the pin's file, whitespace-normalised."""
    m = HUNK_HEADER.match(hunk.header.encode())
    if blob is None or m is None:
        return (), ()
    lines = [_norm(x) for x in blob.splitlines()]
    start = max(int(m[1]) - 1, 0)
    before = [x for x in lines[:start] if x][-_SURROUND:]
    after = [x for x in lines[start + size:] if x][:_SURROUND]
    return tuple(before), tuple(after)


def _needles(pre: Sequence[bytes], post: Sequence[bytes]) -> list[bytes]:
    def telling(lines: Sequence[bytes], n: int, taken: set[bytes]) -> list[bytes]:
        found = sorted({x.strip() for x in lines if len(x.strip()) >= _MIN_NEEDLE} - taken, key=lambda x: (-len(x), x))
        return found[:n]

    first = telling(pre, _NEEDLES, set())
    return first + telling([x for x in post if x not in pre], _NEEDLES // 2, set(first))


def _score(path: str, blob: bytes, pre: Sequence[bytes], post: Sequence[bytes], before: Sequence[bytes],
           after: Sequence[bytes]) -> HunkPlace:
    lines = blob.splitlines()
    norm = [_norm(x) for x in lines]
    best = HunkPlace(path, 0)
    for image, name in ((pre, "pre"), (post, "post")):
        if not image:
            continue
        exact = _positions(lines, list(image))
        at, is_exact = (exact, True) if exact else (_positions(norm, [_norm(x) for x in image]), False)
        if at:
            near = max(_around(norm, p, len(image), before, after) for p in at)
            score = round(0.8 * (100 if is_exact else 90) + 20 * near)
            place = HunkPlace(path, score, at[0] + 1, name, is_exact, True, len(at))
        else:
            place = HunkPlace(path, round(0.8 * 80 * _in_order(norm, [_norm(x) for x in image]) / len(image)), image=name)
        if place.score > best.score:
            best = place
    return best


def _in_order(norm: Sequence[bytes], image: Sequence[bytes]) -> int:
    """How many of the image's lines the file holds in order around its longest run of them (a line changed in
    the middle of the hunk still leaves the rest counted)."""

    run = difflib.SequenceMatcher(None, image, norm, autojunk=False).find_longest_match()
    if run.size == 0:
        return 0
    lo = max(run.b - run.a - len(image), 0)
    window = norm[lo:run.b - run.a + 2 * len(image)]
    return sum(b.size for b in difflib.SequenceMatcher(None, image, window, autojunk=False).get_matching_blocks())


def _positions(lines: Sequence[bytes], image: list[bytes]) -> list[int]:
    if not image:
        return []
    size, first = len(image), image[0]
    return [i for i, x in enumerate(lines) if x == first and list(lines[i:i + size]) == image]


def _around(norm: Sequence[bytes], at: int, size: int, before: Sequence[bytes], after: Sequence[bytes]) -> float:
    """How many of the pin's surrounding lines are around the place (1.0 when there are none to compare)."""
    if not before and not after:
        return 1.0
    window = 3 * _SURROUND
    near_before = set(norm[max(at - window, 0):at])
    near_after = set(norm[at + size:at + size + window])
    hits = sum(x in near_before for x in before) + sum(x in near_after for x in after)
    return hits / (len(before) + len(after))


def _with_commit(repo: Path, pin: str, commit: str, ask: Ask, move: HunkMove, branch: str | None) -> HunkMove:
    """The first commit on the line from the pin where the hunk's code is no longer where the pin had it (or
    where git's pairing of that file took it), bisected, and its first release."""
    if git.resolve_commit(repo, commit) is None:
        return move
    base = pin if commitcache.is_ancestor(repo, pin, commit) else git.merge_base(repo, pin, commit)
    if base is None:
        return move
    line = commitcache.first_parent_commits(repo, base, commit)
    if not line:
        return move
    pre, post = _images(ask.hunk)
    homes = sorted({p for p in (ask.old, ask.at, ask.via) if p is not None})

    def gone(sha: str) -> bool:
        blobs = git.read_blobs(repo, sha, homes)
        return not any(blob is not None and (_positions(blob.splitlines(), list(pre)) or
                                             (post and _positions(blob.splitlines(), list(post))))
                       for blob in blobs.values())

    found = moves.first_where(line, gone)
    subject = commitcache.log_records(repo, None, found, commits=[found])[0].subject
    proof = lineage.first_release(repo, found, branch=branch)
    return replace(move, commit=found, subject=subject, release=proof.release if proof else None)


def _field(pin: str, ask: Ask) -> str:
    key = b"\0".join([_VERSION.encode(), pin.encode(), ask.old.encode(), ask.at.encode(), ask.hunk.text])
    return "hunk-move:" + hashlib.sha256(key).hexdigest()[:24]


# --- the patch with its hunks at the new places ---------------------------------------------------


def relocated(original: Patch, current: Patch, found: Mapping[tuple[str, int], tuple[str, int, str]]) -> Patch:
    """`current` (the patch after following file moves) with each hunk in `found` ((old path, number) -> (new
    path, line where its image starts, "pre"/"post")) moved to that file and place; hunk headers are renumbered,
    a file left with no hunk is left out. Unchanged when `found` names none of its hunks."""
    placed: dict[str, list[tuple[int, Hunk, int | None, str]]] = {}  # path -> (key line, hunk, line, image)
    order: list[str] = []
    headers: dict[str, bytes] = {}
    touched = False
    for fd, was in zip(current.files, original.files, strict=True):
        if fd.path not in headers:
            order.append(fd.path)
            headers[fd.path] = fd.header
            placed.setdefault(fd.path, [])
        for n, hunk in enumerate(fd.hunks, 1):
            target = found.get((was.old_path or "", n))
            if target is None:
                placed[fd.path].append((_start(hunk), hunk, None, "pre"))
                continue
            touched = True
            new, line, image = target
            if new not in headers:
                order.append(new)
                quoted_a, quoted_b = moves.header_path("a/" + new), moves.header_path("b/" + new)
                headers[new] = b"diff --git " + quoted_a + b" " + quoted_b + b"\n--- " + quoted_a + b"\n+++ " + quoted_b + b"\n"
                placed.setdefault(new, [])
            placed[new].append((line, hunk, line, image))
    if not touched:
        return current
    kept = {fd.path: fd for fd in current.files}
    parts = []
    for path in order:
        hunks = sorted(placed[path], key=lambda h: h[0])
        was_there = kept.get(path)
        if not hunks and (was_there is None or (was_there.old_path is not None and was_there.new_path is not None
                                                and was_there.hunks)):
            continue  # every hunk of this file went elsewhere
        parts.append(headers[path] + b"".join(_renumbered(hunks)))
    diff = b"".join(parts)
    start = len(current.raw) - len(current.diff)
    return replace(current, raw=current.raw[:start] + diff, diff=diff, files=parse_diff(diff, where=current.filename))


def _start(hunk: Hunk) -> int:
    m = HUNK_HEADER.match(hunk.header.encode())
    return int(m[1]) if m else 0


def _renumbered(hunks: Sequence[tuple[int, Hunk, int | None, str]]) -> list[bytes]:
    """The hunks of one file in order with their headers' start lines made consistent: a moved hunk starts where
    its image was found (the pre-image: old side; the post-image: new side), the others keep their old side."""
    out, delta = [], 0
    for _, hunk, line, image in hunks:
        m = HUNK_HEADER.match(hunk.header.encode())
        if m is None:
            out.append(hunk.text)
            continue
        old_count = int(m[2]) if m[2] is not None else 1
        new_count = int(m[4]) if m[4] is not None else 1
        if line is None:
            old_start = int(m[1])
        elif image == "post":
            old_start = max(line - delta, 1)
        else:
            old_start = line
        new_start = old_start + delta if old_start else int(m[3])
        delta += new_count - old_count
        counts = (f"-{old_start}" + ("" if m[2] is None else f",{old_count}") + f" +{new_start}"
                  + ("" if m[4] is None else f",{new_count}"))
        first, _, body = hunk.text.partition(b"\n")
        rest = first[m.end():]
        out.append(b"@@ " + counts.encode() + b" @@" + rest + b"\n" + body)
    return out


def plan(found: Mapping[tuple[str, int], HunkMove]) -> dict[tuple[str, int], tuple[str, int, str]]:
    """The placements of the clear winners, as `relocated` takes them."""
    return {key: (m.new, m.winner.line, m.winner.image) for key, m in found.items()
            if m.new is not None and m.winner is not None}

