"""How upstream commits relate the way vLLM releases: tags cut on release branches, fixes cherry-picked
onto them, merged PRs reverted and re-landed. Read-only questions, answered through git.py.

- `direction`: is moving the pin from one ref to another a move forward (possibly across release
  branches) or a real downgrade, and why.
- `first_release`: the lowest release that carries a commit, itself or as a cherry-pick, and the commit
  on which branch that proves it.
- `ancestry_order`: targets oldest first by the commit graph (never by commit date): ancestors first, then
  by where each meets the main branch, then by release version.
- `identity`: where a change was landed (same patch-id, or its PR "(#N)" in a subject) between two
  commits, and whether a later revert took it out again (and a re-land put it back).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path

from packaging.version import InvalidVersion, Version

from vpatch import git
from vpatch.upstream import commitcache

_PR = re.compile(r"\(#(\d+)\)")
_REVERTS = re.compile(r"This reverts commit ([0-9a-f]{7,40})")
_PICKED = re.compile(r"cherry picked from commit ([0-9a-f]{7,40})")


def release_tags(tags: Sequence[str]) -> list[str]:
    """Final release tags (vX.Y.Z...), sorted by version; pre-releases and other tags left out."""
    parsed = [(v, tag) for tag in tags if (v := release_version(tag)) is not None]
    return [tag for _, tag in sorted(parsed)]


def release_version(ref: str) -> object | None:
    """The version of a final release tag ("v1.1.0"), or None when `ref` is not one."""

    try:
        version = Version(ref[1:] if ref[:1] in "vV" else ref)
    except InvalidVersion:
        return None
    return None if (version.is_prerelease or version.is_devrelease) else version


# --- targets in the order of the commit graph ------------------------------------------------


def ancestry_order(repo: Path, refs: Sequence[tuple[str, str]], *, branch: str | None) -> list[tuple[str, str]]:
    """(ref, commit) pairs oldest first, decided by the commit graph and never by commit dates (which lie:
    back-dated commits, a patch release vX.Y.1 cut after vX.(Y+1).0).

    An ancestor comes before its descendants. Two commits on different lines (release branches, main) are
    ordered by where each meets `branch` (main), then, meeting at the same point, by release version; what
    is still tied goes by how many commits each reaches, then by name."""
    main = git.resolve_commit(repo, branch) if branch else None
    meets = {c: (c if commitcache.is_ancestor(repo, c, main) else commitcache.merge_base(repo, c, main)) if main else None
             for _, c in refs}

    def compare(a: tuple[str, str], b: tuple[str, str]) -> int:
        if a[1] == b[1]:
            return 0
        if commitcache.is_ancestor(repo, a[1], b[1]):
            return -1
        if commitcache.is_ancestor(repo, b[1], a[1]):
            return 1
        ma, mb = meets[a[1]], meets[b[1]]
        if ma and mb and ma != mb:
            if commitcache.is_ancestor(repo, ma, mb):
                return -1
            if commitcache.is_ancestor(repo, mb, ma):
                return 1
        va, vb = release_version(a[0]), release_version(b[0])
        if va is not None and vb is not None and va != vb:
            return -1 if va < vb else 1  # type: ignore[operator]
        ca, cb = git.reachable_count(repo, a[1]), git.reachable_count(repo, b[1])
        return (ca > cb) - (ca < cb) or (a[0] > b[0]) - (a[0] < b[0])

    return sorted(refs, key=functools.cmp_to_key(compare))


def nearest_ancestor(repo: Path, commits: Sequence[str], of: str) -> str | None:
    """The last of `commits` (oldest first, as `ancestry_order` lists them) that is an ancestor of `of`."""
    return next((c for c in reversed(commits) if c != of and commitcache.is_ancestor(repo, c, of)), None)


# --- direction of a pin move -------------------------------------------------------------------


@dataclass(frozen=True)
class Direction:
    forward: bool
    reason: str  # why, in words a person can check with git


def direction(repo: Path, *, current: str, current_ref: str, target: str, target_ref: str, branch: str) -> Direction:
    """Whether `target` is newer than the pin `current`.

    Newer: it descends from the pin; or its merge-base with the main branch descends from the pin's
    (a later release branch, or main after a release branch); or, where ancestry does not decide (both
    fork from main at the same point), both are release tags and the target's version is higher."""
    if target == current or git.is_ancestor(repo, current, target):
        return Direction(True, f"{target_ref} descends from the pin {current_ref}")
    main = git.resolve_commit(repo, branch)
    cur_base = commitcache.merge_base(repo, current, main) if main else None
    tgt_base = commitcache.merge_base(repo, target, main) if main else None
    if cur_base and tgt_base and cur_base != tgt_base:
        if git.is_ancestor(repo, cur_base, tgt_base):
            return Direction(True, f"{target_ref} meets {branch} at {tgt_base[:12]}, which descends from where the pin"
                                   f" {current_ref} meets it ({cur_base[:12]})")
        if git.is_ancestor(repo, tgt_base, cur_base):
            return Direction(False, f"{target_ref} meets {branch} at {tgt_base[:12]}, before the pin {current_ref}"
                                    f" does ({cur_base[:12]}): {branch} commits the pin has are missing from it")
    old, new = release_version(current_ref), release_version(target_ref)
    if old is not None and new is not None:
        if new > old:  # type: ignore[operator]
            return Direction(True, f"both are release tags and {target_ref} is the higher version")
        return Direction(False, f"{target_ref} is a lower release than the pin {current_ref}")
    return Direction(False, f"{target_ref} ({target[:12]}) does not descend from the pin {current_ref} ({current[:12]})"
                            f" and neither ancestry on {branch} nor release versions say it is newer")


# --- the first release that carries a commit ---------------------------------------------------


@dataclass(frozen=True)
class ReleaseProof:
    release: str
    commit: str  # the commit in that release that carries the change
    branch: str | None  # a branch that holds `commit` ("main", "releases/v1.1"); None: on none
    picked: bool  # `commit` is a cherry-pick of the landing commit, not the landing commit itself
    original: str | None = None  # the commit `commit` says it was cherry-picked from, when it says so

    def __str__(self) -> str:
        where = f" on {self.branch}" if self.branch else ""
        how = "cherry-pick " if self.picked else ""
        of = f", cherry-picked from {self.original[:12]}" if self.original else ""
        return f"{self.release} ({how}{self.commit[:12]}{where}{of})"


def refs_state(repo: Path) -> str:
    """A digest of every tag and branch: what a first release depends on besides commit ids."""
    refs = [f"{name} {sha}" for prefix in ("refs/tags/", "refs/heads/") for name, sha in git.ref_values(repo, prefix).items()]
    return hashlib.sha256("\n".join(sorted(refs)).encode()).hexdigest()


def first_release(repo: Path, commit: str, *, branch: str | None, state: str | None = None) -> ReleaseProof | None:
    """The lowest release carrying `commit`: one whose tag contains it, or, with a `branch` (a git
    upstream with release branches), one whose release branch holds a cherry-pick of it - named by
    "(cherry picked from commit ...)", the same "(#N)" in the subject, or the same patch-id.
    Kept in the commit cache by the commit and the state of every tag and branch (`state`: refs_state's
    digest, when the caller has it)."""
    if not git.is_object_id(commit):
        return _first_release(repo, commit, branch=branch)
    state = state or refs_state(repo)
    found = commitcache.memo(
        commit, "first-release", [branch or "", state], lambda: (_first_release(repo, commit, branch=branch),),
        dump=lambda proof: {"proof": proof[0] and [getattr(proof[0], f.name) for f in fields(ReleaseProof)]},
        load=lambda stored: (stored["proof"] and ReleaseProof(*stored["proof"]),))
    return found[0]


def _first_release(repo: Path, commit: str, *, branch: str | None) -> ReleaseProof | None:
    tags = release_tags(git.tags(repo, "v*"))
    tags_in, branches_in = git.refs_containing(repo, commit)
    containing = set(tags_in)
    first = next((t for t in tags if t in containing), None)
    main = git.resolve_commit(repo, branch) if branch is not None else None
    if main is not None:
        earlier = tags[: tags.index(first) if first else len(tags)]
        # Only a release tagged off main (on a release branch) can carry a cherry-pick. Commit dates say
        # nothing here (a back-dated pick is still a pick), so every such earlier release is searched; each
        # search walks only that branch's own commits.
        tagged = git.resolve_commits(repo, earlier)
        # every release tag's branch in one walk, shared by every landing this process looks up
        own = _off_main(repo, [c for c in git.resolve_commits(repo, tags).values() if c], main)
        off_main = {c.commit for c in own}
        candidates = [t for t in earlier if tagged[t] in off_main]
        if candidates:
            change = _Change.of(repo, commit)
            for tag in candidates:
                pick = change.picked_in(repo, own, tagged[tag] or "")
                if pick is not None:
                    return ReleaseProof(tag, pick, _branch_of(repo, pick, branch or "main"), picked=True)
    if first is None:
        return None
    on = _branch_of(repo, commit, branch, names=branches_in) if branch else None
    original = None
    if branch and on != branch:
        # landed on a release branch itself: name the main commit it was picked from, when it says
        picked = _PICKED.search(commitcache.log_records(repo, None, commit, commits=[commit])[0].body)
        original = picked.group(1) if picked else None
    return ReleaseProof(first, commit, on, picked=False, original=original)


@dataclass(frozen=True)
class _Change:
    """What identifies one landing commit's change on another branch."""

    commit: str
    pr: str | None  # "(#N)" from its subject
    paths: tuple[str, ...]
    patch_id: str | None

    @classmethod
    def of(cls, repo: Path, commit: str) -> _Change:
        subject = commitcache.log_records(repo, None, commit, commits=[commit])[0].subject
        prs = _PR.findall(subject)
        paths = tuple(git.changed_paths(repo, commit))
        return cls(commit, f"(#{prs[-1]})" if prs else None, paths,
                   git.commit_patch_id(repo, commit, paths) if paths else None)

    def picked_in(self, repo: Path, own: Sequence[git.BranchCommit], tag_commit: str) -> str | None:
        """A commit on the tag's own release branch (past where it meets main; `own`: every release branch's
        own commits, newest first) that carries this change."""
        reach = _reaching(own, tag_commit)
        mine = [c for c in own if c.commit in reach]
        for record in mine:
            picked = _PICKED.search(record.body)
            if picked and self.commit.startswith(picked.group(1)):
                return record.commit
            if self.pr and self.pr in record.subject and not _is_revert(record.subject):
                return record.commit
        if self.patch_id:
            touching = [c.commit for c in mine if len(c.parents) == 1 and set(c.paths) & set(self.paths)]
            ids = commitcache.patch_ids(repo, touching, self.paths)
            found = [c for c in touching if ids[c] == self.patch_id]
            if found:
                return found[-1]
        return None


_OFF_MAIN: dict[tuple[Path, str, tuple[str, ...]], list[git.BranchCommit]] = {}


def _off_main(repo: Path, tips: Sequence[str], main: str) -> list[git.BranchCommit]:
    """Release branches' own commits up to `tips`: one walk per process (commit ids fix the answer)."""
    key = (repo, main, tuple(sorted(tips)))
    if key not in _OFF_MAIN:
        _OFF_MAIN[key] = git.commits_off(repo, sorted(tips), main)
    return _OFF_MAIN[key]


def _reaching(own: Sequence[git.BranchCommit], tip: str) -> set[str]:
    """Which of `own` `tip` reaches (their parents on main are not in `own`)."""
    parents = {c.commit: c.parents for c in own}
    seen: set[str] = set()
    todo = [tip]
    while todo:
        c = todo.pop()
        if c in seen or c not in parents:
            continue
        seen.add(c)
        todo.extend(parents[c])
    return seen


def _branch_of(repo: Path, commit: str, main: str, *, names: Sequence[str] | None = None) -> str | None:
    """`names`: the branches holding `commit`, when the caller has read them."""
    names = git.branches_containing(repo, commit) if names is None else names
    if main in names:
        return main
    # the release branch it was committed on: the one whose name sorts first among those holding it
    return min(names) if names else None


# --- landed, reverted, re-landed ---------------------------------------------------------------


class HistoryStep(str, Enum):
    LANDED = "landed"
    REVERTED = "reverted"
    RELANDED = "re-landed"


@dataclass(frozen=True)
class HistoryEvent:
    step: HistoryStep
    commit: str
    subject: str
    by: tuple[str, ...]  # what matched: "patch-id", "upstream-pr", "reverts <sha>"

    def __str__(self) -> str:
        return f"{self.step.value} in {self.commit[:12]} \"{self.subject}\""


@dataclass(frozen=True)
class ChangeHistory:
    """What the history between two commits says about one change, oldest event first."""

    events: tuple[HistoryEvent, ...]

    @property
    def landed(self) -> HistoryEvent | None:
        """The landing that still stands at the tip (None: never landed, or reverted since)."""
        last = self.events[-1] if self.events else None
        return last if last is not None and last.step is not HistoryStep.REVERTED else None

    @property
    def standing_since(self) -> HistoryEvent | None:
        """The first landing of the run that still stands at the tip (the re-land after the last revert)."""
        if self.landed is None:
            return None
        run: list[HistoryEvent] = []
        for event in self.events:
            run = [] if event.step is HistoryStep.REVERTED else [*run, event]
        return run[0]

    @property
    def reverted(self) -> HistoryEvent | None:
        last = self.events[-1] if self.events else None
        return last if last is not None and last.step is HistoryStep.REVERTED else None

    @property
    def reverts(self) -> tuple[str, ...]:
        """The commits that reverted the change, oldest first."""
        return tuple(e.commit for e in self.events if e.step is HistoryStep.REVERTED)

    def matched(self, kind: str) -> list[HistoryEvent]:
        return [e for e in self.events if kind in e.by]

    def stands(self, kind: str) -> tuple[HistoryEvent | None, HistoryEvent | None]:
        """For one kind of identity ("patch-id", "upstream-pr"): the first of its landings that still stands at
        the tip, else the last one (reverted since); (None, None) when it names no landing. A reverted landing
        is no landing."""
        matched = [e for e in self.matched(kind) if e.step is not HistoryStep.REVERTED]
        standing = self.standing_since
        if standing is not None:
            start = self.events.index(standing)
            current = [e for e in matched if self.events.index(e) >= start]
            if current:
                return current[0], None
        return None, (matched[-1] if matched else None)

    @property
    def relanded(self) -> bool:
        """Landed again after a revert, and standing at the tip."""
        return self.standing_since is not None and any(e.step is HistoryStep.REVERTED for e in self.events)

    def story(self) -> str:
        """"landed in a (#1), reverted in b, re-landed in c" - the whole chain."""
        return ", ".join(str(e) for e in self.events)


def identity_grep(pr: int | None) -> list[str]:
    """What `identity` looks for in commit messages: reverts, and the change's PR."""
    return ["This reverts commit"] + ([f"(#{pr})"] if pr is not None else [])


def identity(repo: Path, base: str, tip: str, *, patch_id: str | None, paths: Sequence[str], pr: int | None) -> ChangeHistory:
    """Landings of a change in base..tip (a commit with `patch_id` on `paths`, or "(#pr)" in a subject),
    the reverts of those landings ("This reverts commit <sha>" or 'Revert "..."'), and re-lands.
    Kept in the commit cache by the two commit ids and what identifies the change."""
    if not (git.is_object_id(base) and git.is_object_id(tip)):
        return _identity(repo, base, tip, patch_id=patch_id, paths=paths, pr=pr)
    return commitcache.memo(
        tip, "identity", [base, patch_id or "", str(pr), *paths],
        lambda: _identity(repo, base, tip, patch_id=patch_id, paths=paths, pr=pr),
        dump=lambda found: [[e.step.value, e.commit, e.subject, list(e.by)] for e in found.events],
        load=lambda stored: ChangeHistory(tuple(HistoryEvent(HistoryStep(step), c, subject, tuple(by)) for step, c, subject, by in stored)))


def _identity(repo: Path, base: str, tip: str, *, patch_id: str | None, paths: Sequence[str], pr: int | None) -> ChangeHistory:
    by_commit: dict[str, set[str]] = {}
    if patch_id:
        for sha in commitcache.patch_id_commits(repo, base, tip, paths).get(patch_id, []):
            by_commit.setdefault(sha, set()).add("patch-id")
    grep = identity_grep(pr)
    records = {r.commit: r for r in commitcache.log_records(repo, base, tip, grep=grep)}
    for r in records.values():
        if pr is not None and f"(#{pr})" in r.subject:
            by_commit.setdefault(r.commit, set()).add("upstream-pr")
    if not by_commit:
        return ChangeHistory(())
    missing = [c for c in by_commit if c not in records]
    records.update({r.commit: r for r in commitcache.log_records(repo, None, tip, commits=missing)} if missing else {})
    order = commitcache.topo_positions(repo, base, tip, list(records))
    events: list[HistoryEvent] = []
    changes: set[str] = set()  # commits that put the change in (landings and re-lands)
    undos: set[str] = set()  # commits that took it out
    for sha in sorted(records, key=lambda c: order.get(c, -1)):
        record, matched = records[sha], by_commit.get(sha, set())
        reverted = _REVERTS.search(record.body)
        target = reverted.group(1) if reverted else None
        if _names(target, changes) or (matched and _is_revert(record.subject)):
            undos.add(sha)
            events.append(HistoryEvent(HistoryStep.REVERTED, sha, record.subject, (*sorted(matched), f"reverts {target or 'by subject'}")))
        elif _names(target, undos) or (matched and events and events[-1].step is HistoryStep.REVERTED):
            changes.add(sha)
            events.append(HistoryEvent(HistoryStep.RELANDED, sha, record.subject, tuple(sorted(matched))))
        elif matched:
            changes.add(sha)
            events.append(HistoryEvent(HistoryStep.LANDED, sha, record.subject, tuple(sorted(matched))))
    return ChangeHistory(tuple(events))


def revert_commits(repo: Path, base: str, tip: str) -> set[str]:
    """The commits of base..tip that revert another ("This reverts commit <sha>", as `git revert` writes it, or
    a 'Revert "..."' subject): where a change may have gone out again."""
    records = commitcache.log_records(repo, base, tip, grep=identity_grep(None))
    return {r.commit for r in records if _REVERTS.search(r.body) or _is_revert(r.subject)}


def _names(prefix: str | None, commits: set[str]) -> bool:
    return prefix is not None and any(c.startswith(prefix) for c in commits)


def _is_revert(subject: str) -> bool:
    """'Revert "x"' is a revert; 'Revert "Revert "x""' and 'Reapply "x"' put x back."""
    depth = 0
    while subject.startswith('Revert "'):
        depth += 1
        subject = subject[len('Revert "'):]
    return depth % 2 == 1
