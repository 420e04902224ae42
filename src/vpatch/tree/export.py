"""Export the commits of the applied tree back to the series files: each commit to its numbered file (by its
Vpatch-File line, or the number export gives it), nothing written unless every file reads back."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from vpatch import git
from vpatch.base import GitError, SeriesError, VpatchError, atomic_write
from vpatch.series import PATCH_NAME, Patch, Series, slugify, unfinished
from vpatch.tree.stack import MARKER, AppliedPatch, Stack, load_stack, save_stack, strip_marker


def tree_patch(state_dir: Path, key: str, directory: Path) -> tuple[str, Patch | None]:
    """A patch not exported yet, by its number or name, from the commits of the applied tree (their Vpatch-File
    lines; `vpatch new` made it there): its name (NNNN-slug) and the patch its commit exports as (None while
    the commit changes nothing)."""
    stack = load_stack(state_dir, required=False)
    if stack is not None and git.is_repo(stack.worktree):
        for record in git.log_records(stack.worktree, stack.base, "HEAD", grep=[f"{MARKER}: "]):
            for file in re.findall(rf"^{MARKER}: (\S+)$", record.body, re.M):
                m = PATCH_NAME.match(file)
                if m is None or not (key in (file, file.removesuffix(".patch"))
                                     or (key.isdigit() and int(key) == int(m["number"]))):
                    continue
                _, raw = strip_marker(git.format_patch(stack.worktree, record.commit))
                try:
                    return file.removesuffix(".patch"), Patch.parse(raw, number=int(m["number"]), slug=m["slug"],
                                                                    path=directory / file)
                except SeriesError:
                    return file.removesuffix(".patch"), None
    raise SeriesError(f"no patch {key!r} in the series or in the applied tree",
                      hint="vpatch status lists the patches by number; `vpatch new SLUG` starts a new one")


@dataclass(frozen=True)
class ExportResult:
    unchanged: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    writes: dict[str, bytes] = field(default_factory=dict, repr=False)
    rewritten: tuple[str, ...] = ()  # files that did not parse (a hand-edited hunk), written afresh from their commit
    unmarked: tuple[str, ...] = ()  # added from commits without a Vpatch-File line: a plain `git commit` in the tree


def export_series(series: Series, state_dir: Path, *, dry_run: bool = False, force: bool = False,
                  check_edits: bool = True) -> ExportResult:
    """Write the commits of the applied tree back to numbered files; nothing is written on error.

    A file export would overwrite, remove or bring back that changed since vpatch last read or wrote it is
    refused (`force` overwrites it). `check_edits=False`: the caller's tree was built from the files as they
    are (update's own tree), so there is nothing to compare with."""
    stack = load_stack(state_dir)
    assert stack is not None
    tree = stack.worktree
    if not tree.is_dir() or not git.is_repo(tree):
        raise VpatchError(f"the applied tree {tree} is missing", hint="vpatch apply to create it again")
    dirty = git.dirty_paths(tree)
    if dirty:
        shown = ", ".join(dirty[:5]) + (" ..." if len(dirty) > 5 else "")
        raise VpatchError(f"the applied tree {tree} has uncommitted changes: {shown}",
                          hint="commit them (git commit --amend, or a new commit for a new patch) or discard them, then export")
    commits = git.commits_between(tree, stack.base)
    for c in commits:
        if len(git.parents(tree, c)) != 1:
            raise VpatchError(f"commit {c[:12]} in {tree} is a merge", hint="the series must be a straight line of commits; rebase it")
    if not git.is_ancestor(tree, stack.base, "HEAD"):
        raise VpatchError(f"HEAD of {tree} no longer descends from the base {stack.base[:12]}",
                          hint="rebase your commits onto the base, or vpatch apply afresh")

    existing = {p.filename: p for p in series}
    outputs, sources, marked = _name_commits(series, stack, commits)
    _check_output(series, outputs, sources)
    numbers: dict[int, str] = {}
    for name in outputs:
        n = int(name[:4])
        if n in numbers:
            raise SeriesError(f"two commits map to number {n:04d}: {numbers[n]} and {name}",
                              hint="remove the Vpatch-File line from the copied commit's message so it gets a new number")
        numbers[n] = name
    broken = dict(series.unreadable)
    for name, exc in broken.items():
        if name not in outputs:  # nothing in the tree to rewrite it from
            raise SeriesError(f"{exc.message} (and no commit of the applied tree {tree} is {name})", hint=exc.hint)
    unchanged = tuple(n for n, raw in outputs.items() if n in existing and existing[n].raw == raw)
    changed = tuple(n for n, raw in outputs.items() if (n in existing and existing[n].raw != raw) or n in broken)
    added = tuple(n for n in outputs if n not in existing and n not in broken)
    removed = tuple(n for n in existing if n not in outputs)
    unmarked = tuple(n for n in added if sources[n] not in marked)
    if check_edits and not force:
        refuse_hand_edits(series.directory, stack, changed + removed, added)
    result = ExportResult(unchanged, changed, added, removed, {n: outputs[n] for n in changed + added},
                          rewritten=tuple(broken), unmarked=unmarked)
    if dry_run:
        return result
    # The record first: it fixes each new commit's number, so an export killed half-way and run again
    # writes the same files under the same names. Each file is replaced atomically.
    # The old digests stay in the record until every file is written: the files an export killed half-way
    # did not reach are still vpatch's, not hand edits.
    applied = tuple(AppliedPatch(n, c, digest(outputs[n])) for n, c in zip(outputs, commits))
    done = Stack(stack.worktree, stack.upstream, stack.ref, stack.base, applied)
    save_stack(state_dir, replace(done, pending=stack.pending or stack.applied))
    for name in changed + added:
        atomic_write(series.directory / name, outputs[name])
    for name in removed:
        (series.directory / name).unlink()
    save_stack(state_dir, done)
    return result


def digest(data: bytes) -> str:
    """What the record keeps of a patch file's content (Patch.sha256 for a file that parses)."""
    return hashlib.sha256(data).hexdigest()


def hand_edits(directory: Path, stack: Stack, replaced: tuple[str, ...], recreated: tuple[str, ...]) -> list[str]:
    """Of the files an export would overwrite or remove (`replaced`) or write again (`recreated`), those vpatch
    did not leave as they are: what is wrong with each, in words. A record of an older vpatch (no digests)
    knows nothing, so nothing is said of the files it holds."""
    # an export killed half-way left each file as it was before (`pending`) or as it wrote it (`applied`)
    known: dict[str, set[str | None]] = {}
    for a in (*stack.applied, *stack.pending):
        known.setdefault(a.file, set()).add(a.digest)
    if known and all(d == {None} for d in known.values()):
        return []
    before = {a.file: a.digest for a in (stack.pending or stack.applied)}
    found = []
    for name in replaced:
        path = directory / name
        if not path.is_file():
            continue
        if name not in known:
            found.append(f"{directory.name}/{name} is not a patch of the applied tree (added, or not applied, "
                         "after vpatch applied it)")
        elif None not in known[name] and digest(path.read_bytes()) not in known[name]:
            found.append(f"{directory.name}/{name} was changed since vpatch last wrote it")
    for name in recreated:
        if before.get(name) is not None and not (directory / name).exists():
            found.append(f"{directory.name}/{name} was removed since vpatch last wrote it")
    return found


def refuse_hand_edits(directory: Path, stack: Stack, replaced: tuple[str, ...], recreated: tuple[str, ...]) -> None:
    """The error for `hand_edits`: nothing written, the files named, the two ways on."""
    found = hand_edits(directory, stack, replaced, recreated)
    if not found:
        return
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    raise VpatchError("; ".join(found[:3]) + more + ": export would replace that with the applied tree's version; "
                      "nothing was written",
                      hint="to keep the file, `vpatch apply --force` reads the series into a new applied tree (the "
                           "tree's own unexported commits are thrown away); to keep the tree's version, "
                           "`vpatch export --force`")


def _name_commits(series: Series, stack: Stack, commits: list[str]) -> tuple[dict[str, bytes], dict[str, str], set[str]]:
    """Each commit of the tree as the file export writes: {name: content}, {name: commit}, and the commits that
    carry their file's marker (applied by vpatch, or `vpatch new`)."""
    tree = stack.worktree
    existing = {p.filename for p in series}
    next_number = series.next_number()
    # A commit without the marker keeps the name it was first exported under: by its SHA, or (amended since)
    # by the slug of its subject among the names recorded for commits that are gone.
    recorded = {a.commit: a.file for a in stack.applied}
    gone = [a.file for a in stack.applied if a.commit not in commits]
    outputs: dict[str, bytes] = {}
    sources: dict[str, str] = {}
    marked: set[str] = set()
    for c in commits:
        raw = git.format_patch(tree, c)
        name, raw = strip_marker(raw)
        if name is not None:
            marked.add(c)
        if name is None:
            subject = git.commit_subject(tree, c)
            name = recorded.get(c) or next((f for f in gone if f[5:] == f"{slugify(subject)}.patch"), None)
            if name in gone:
                gone.remove(name)
        if name is None or name in outputs or not (name in existing or _is_series_name(name)):
            subject = git.commit_subject(tree, c)
            name = f"{next_number:04d}-{slugify(subject)}.patch"
            next_number += 1
        outputs[name] = raw
        sources[name] = c
    return outputs, sources, marked


@dataclass(frozen=True)
class TreeWork:
    """What the applied tree holds that `patches/` does not: the checks read one or the other, and say which."""

    tree: Path
    patches: tuple[Patch, ...]  # the series as the tree's commits export it (a commit that changes nothing left out)
    unexported: tuple[str, ...]  # files whose commit is new or changed in the tree since apply/export, or dropped there
    dirty: tuple[str, ...]  # uncommitted paths in the tree

    def describe(self) -> str:
        """The work in a few words: "0005-x.patch, 0006-y.patch and uncommitted changes (vllm/a.py)"."""
        parts = list(self.unexported[:4]) + ([f"{len(self.unexported) - 4} more"] if len(self.unexported) > 4 else [])
        if self.dirty:
            parts.append("uncommitted changes (" + ", ".join(self.dirty[:3]) + (" ..." if len(self.dirty) > 3 else "") + ")")
        return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]


def tree_work(series: Series, state_dir: Path) -> TreeWork | None:
    """The applied tree's work not exported to `patches/`; None when there is no tree or it holds none.

    A commit counts as changed when vpatch would write it differently from the commit apply or export last
    recorded for its file (a file apply read as hand-written text is not "changed" by being reformatted)."""
    try:
        stack = load_stack(state_dir, required=False)
    except VpatchError:
        return None  # an unreadable record: the commands that need it say so
    if stack is None or not stack.worktree.is_dir() or not git.is_repo(stack.worktree):
        return None
    tree = stack.worktree
    if not git.is_ancestor(tree, stack.base, "HEAD"):
        return None
    dirty = tuple(git.dirty_paths(tree))
    if git.head(tree) == stack.tip and not dirty:
        return None  # nothing done in the tree since apply/export: the cheap, usual case
    commits = git.commits_between(tree, stack.base)
    outputs, _, _ = _name_commits(series, stack, commits)
    recorded = {a.file: a.commit for a in stack.applied}
    unexported = []
    for name, raw in outputs.items():
        old = recorded.get(name)
        if old is None or (old not in commits and _exported_as(tree, old) != raw):
            unexported.append(name)
    unexported += [name for name in recorded if name not in outputs]
    patches = []
    for name, raw in outputs.items():
        m = PATCH_NAME.match(name)
        assert m is not None
        try:
            patches.append(Patch.parse(raw, number=int(m["number"]), slug=m["slug"], path=series.directory / name))
        except SeriesError:
            continue  # `vpatch new` started it and it changes nothing yet
    if not unexported and not dirty:
        return None
    return TreeWork(tree, tuple(patches), tuple(unexported), dirty)


def _exported_as(tree: Path, commit: str) -> bytes | None:
    """What export made of a commit recorded earlier (kept by the tree's reflog); None when it is gone."""
    try:
        return strip_marker(git.format_patch(tree, commit))[1]
    except GitError:
        return None


def _check_output(series: Series, outputs: dict[str, bytes], sources: dict[str, str]) -> None:
    """Export writes only files that vpatch itself reads back: each one parses, with its checks."""
    for name, raw in outputs.items():
        m = PATCH_NAME.match(name)
        assert m is not None
        try:
            patch = Patch.parse(raw, number=int(m["number"]), slug=m["slug"], path=series.directory / name)
        except SeriesError as exc:
            commit = sources[name][:12]
            if _find_diff_start(raw) < 0:
                raise SeriesError(f"commit {commit} ({name}) changes nothing: it would export as a patch without a diff; "
                                  "nothing was written",
                                  hint="make the change and `git commit --amend` it, or drop the empty commit "
                                       "(git rebase -i), then vpatch export") from None
            raise SeriesError(f"commit {commit} would export as {name}, which vpatch cannot read back: {exc.message}; "
                              "nothing was written", hint=exc.hint) from None
        problems = unfinished(patch)
        if problems:
            line, wrong, todo = problems[0]
            more = f" (and {len(problems) - 1} more such line(s))" if len(problems) > 1 else ""
            raise SeriesError(f"commit {sources[name][:12]} would export as {name} with the {line}: "
                              f"{wrong}{more}; nothing was written",
                              hint=f"{todo}: `git commit --amend` in the applied tree, then vpatch export")


def _find_diff_start(raw: bytes) -> int:
    return 0 if raw.startswith(b"diff --git ") else raw.find(b"\ndiff --git ")


def _is_series_name(name: str) -> bool:
    return PATCH_NAME.match(name) is not None
