"""One range of upstream history (reachable from a status's targets, not from the pin), read by three git walks
and held in memory for this process: every later question about a commit inside it (is it an ancestor of that
bisection step, which of the patches' files does it change, does its message name a PR or a revert) is answered
without another walk. At vLLM's size (tens of thousands of commits) a walk costs tenths of a second, and a
status asks hundreds of such questions.

`declare` names the range and what will be asked of it; it is read from git on the first question that needs it
(a second status answers from the commit cache and never reads it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vpatch import git


@dataclass
class Range:
    base: str
    tips: tuple[str, ...]
    paths: frozenset[str]  # the files whose changes were recorded (touched)
    greps: frozenset[str]  # the literal strings whose commits' messages were kept (matched)
    order: list[str]  # oldest first, parents before children
    parents: dict[str, tuple[str, ...]]
    touched: dict[str, tuple[str, ...]]  # non-merge commit -> the `paths` it changes
    matched: dict[str, git.LogRecord]  # commit -> message, for those naming any of `greps`
    path_sets: tuple[tuple[str, ...], ...] = ()  # the patches' own paths, whose patch-ids will be asked for
    prefetched: bool = False  # the patch-ids of every (touching commit, path set) are in the commit cache
    _lines: dict[str, dict[str, int]] = field(default_factory=dict)  # tip -> commit -> position on its first-parent line
    _merged: dict[str, dict[str, int]] = field(default_factory=dict)  # tip -> commit -> where it joins that line
    _reach: dict[str, frozenset[str]] = field(default_factory=dict)  # commit -> its ancestors in the range
    _position: dict[str, int] = field(default_factory=dict)

    @classmethod
    def read(cls, repo: Path, base: str, tips: Sequence[str], paths: Sequence[str], greps: Sequence[str]) -> Range:
        pairs = git.range_parents(repo, base, tips)
        return cls(base, tuple(tips), frozenset(paths), frozenset(greps), [c for c, _ in pairs], dict(pairs),
                   git.range_touching(repo, base, tips, sorted(paths)),
                   {r.commit: r for r in git.range_grep(repo, base, tips, sorted(greps))})

    def __contains__(self, commit: str) -> bool:
        return commit in self.parents

    def covers(self, base: str | None, tip: str, *, paths: Sequence[str] = (), greps: Sequence[str] = ()) -> bool:
        """Whether base..tip lies inside this range and what is asked was recorded."""
        return (base == self.base and tip in self and self.paths.issuperset(paths)
                and self.greps.issuperset(greps))

    def ancestors(self, tip: str) -> frozenset[str] | _LinePrefix:
        """base..tip as a membership test (tip in the range)."""
        for line_tip in self.tips:
            line = self._line(line_tip)
            if tip in line:
                return _LinePrefix(self._merged[line_tip], line[tip])
        if tip not in self._reach:
            seen: set[str] = set()
            todo = [tip]
            while todo:
                c = todo.pop()
                if c in seen or c not in self.parents:
                    continue
                seen.add(c)
                todo.extend(self.parents[c])
            self._reach[tip] = frozenset(seen)
        return self._reach[tip]

    def _line(self, tip: str) -> dict[str, int]:
        """Positions on tip's first-parent line and, for every commit it reaches, the first line commit that
        reaches it: c is an ancestor of line commit m exactly when merged[c] <= line[m]."""
        if tip not in self._lines:
            line: list[str] = []
            c: str | None = tip
            while c is not None and c in self.parents:
                line.append(c)
                c = self.parents[c][0] if self.parents[c] else None
            line.reverse()
            merged: dict[str, int] = {}
            for i, head in enumerate(line):
                todo = [head]
                while todo:
                    c = todo.pop()
                    if c in merged or c not in self.parents:
                        continue
                    merged[c] = i
                    todo.extend(self.parents[c])
            self._lines[tip] = {c: i for i, c in enumerate(line)}
            self._merged[tip] = merged
        return self._lines[tip]

    def position(self, commit: str) -> int:
        """Where `commit` sits in `order` (oldest first)."""
        if not self._position:
            self._position.update((c, i) for i, c in enumerate(self.order))
        return self._position[commit]

    def newest_first_of(self, commits: Sequence[str]) -> list[str]:
        return sorted(commits, key=self.position, reverse=True)


@dataclass(frozen=True)
class _LinePrefix:
    merged: dict[str, int]
    upto: int

    def __contains__(self, commit: object) -> bool:
        at = self.merged.get(commit) if isinstance(commit, str) else None
        return at is not None and at <= self.upto


@dataclass
class _Declared:
    repo: Path
    base: str
    tips: tuple[str, ...]
    paths: frozenset[str]
    greps: frozenset[str]
    path_sets: tuple[tuple[str, ...], ...]
    loaded: Range | None = None


_declared: list[_Declared] = []


def _read(d: _Declared) -> Range:
    loaded = Range.read(d.repo, d.base, d.tips, sorted(d.paths), sorted(d.greps))
    loaded.path_sets = d.path_sets
    return loaded


def declare(repo: Path, base: str, tips: Sequence[str], *, path_sets: Sequence[Sequence[str]],
            greps: Sequence[str]) -> None:
    """The range base..tips that questions will be asked about (read from git only when one needs it):
    patch-ids on each of `path_sets`, messages naming any of `greps`."""
    paths = {p for group in path_sets for p in group}
    for d in _declared:
        if (d.repo, d.base, d.tips) == (repo, base, tuple(tips)) and d.paths >= paths and d.greps >= set(greps):
            return
    _declared.append(_Declared(repo, base, tuple(tips), frozenset(paths), frozenset(greps),
                               tuple(tuple(group) for group in path_sets)))


def find(repo: Path, base: str | None, tip: str, *, paths: Sequence[str] = (), greps: Sequence[str] = ()) -> Range | None:
    """A declared range that holds base..tip and the facts asked for, read now if it was not yet."""
    for d in _declared:
        if d.repo != repo or d.base != base or not d.paths.issuperset(paths) or not d.greps.issuperset(greps):
            continue
        if d.loaded is None:
            d.loaded = _read(d)
        if d.loaded.covers(base, tip, paths=paths, greps=greps):
            return d.loaded
    return None


def read_declared(repo: Path, base: str) -> Range | None:
    """The range declared from `base` (the first, when several were), read now if it was not yet; None: none was."""
    for d in _declared:
        if d.repo == repo and d.base == base:
            if d.loaded is None:
                d.loaded = _read(d)
            return d.loaded
    return None


def ancestry(repo: Path, ancestor: str, descendant: str) -> bool | None:
    """Whether `ancestor` is an ancestor of `descendant`, when a range already read says (None: none does)."""
    for d in _declared:
        r = d.loaded
        if r is None or d.repo != repo:
            continue
        if descendant == r.base and ancestor in r:
            return False  # inside the range: not reachable from its base
        if descendant in r and ancestor in r:
            return ancestor in r.ancestors(descendant)
    return None


def forget() -> None:
    """Drop every declared range (a new process would know none)."""
    _declared.clear()
