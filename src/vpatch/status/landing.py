"""The landing search: the first commit between one where a change is not and one where it is, by bisection on
the first-parent line, with vLLM's release-branch and revert rules. `status` finds a landed patch's landing
point with it, and narrowing a dropped hunk's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vpatch.upstream import cached_first_parent_commits, cached_is_ancestor, cached_merge_base


@dataclass(frozen=True)
class Search:
    """Where a landing search found the first commit that has a change."""

    commit: str
    checks: int  # how many times it asked `landed`
    candidates: int  # the first-parent commits it searched (after the last revert)


def search_landing(repo: Path, *, below: str, top: str, main: str | None, landed: Callable[[str], bool],
           floor: Callable[[Sequence[str]], int]) -> Search | None:
    """The first commit between `below` (not landed) and `top` (landed) where `landed` holds: the first-parent
    line of _bisect_range (release branches: main between the merge-bases, or the branch's own commits),
    searched after `floor(line)` (the position after the last revert of the change: a revert makes "landed"
    non-monotonic), by bisection. `main`: the commit upstream's main branch names (None: no per-commit
    history). None when the two commits share no history to search."""
    base, tip = _bisect_range(repo, below, top, main, landed)
    if base is None:
        return None
    line = cached_first_parent_commits(repo, base, tip)
    start = floor(line)
    found, checks = bisect_first(line[start:], landed) if line[start:] else (tip, 0)
    return Search(found, checks, len(line) - start)


def _bisect_range(repo: Path, below: str, top: str, main: str | None,
                  landed: Callable[[str], bool]) -> tuple[str | None, str]:
    """The first-parent line to bisect: below..top when top descends from below; else, on a git upstream with
    release branches, main between the two merge-bases when main already had the change where `top`'s
    release branch forked, or that release branch's own commits when it did not."""
    if main is not None and not cached_is_ancestor(repo, top, main):
        top_base = cached_merge_base(repo, top, main)
        if top_base is not None and landed(top_base):
            below_base = cached_merge_base(repo, below, main)
            if below_base is not None and below_base != top_base and cached_is_ancestor(repo, below_base, top_base):
                return below_base, top_base
        elif top_base is not None:
            start = below if cached_is_ancestor(repo, below, top) else top_base
            return start, top
    if cached_is_ancestor(repo, below, top):
        return below, top
    return cached_merge_base(repo, below, top), top


def bisect_first(line: Sequence[str], landed: Callable[[str], bool]) -> tuple[str, int]:
    """The first commit of `line` (oldest first, whose last commit is known landed) where `landed` holds,
    assuming once landed it stays landed; returns it and how many checks it took."""
    lo, hi, checks = 0, len(line) - 1, 0
    while lo < hi:
        mid = (lo + hi) // 2
        checks += 1
        if landed(line[mid]):
            hi = mid
        else:
            lo = mid + 1
    return line[hi], checks
