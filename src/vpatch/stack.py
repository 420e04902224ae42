"""Apply the series onto a ref as one commit per patch, and export those commits back to the files."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

from vpatch import git, moves
from vpatch.errors import ApplyError, SeriesError, VpatchError
from vpatch.fs import atomic_write
from vpatch.series import PATCH_NAME, Patch, Series, slugify
from vpatch.trailers import unfinished

# Each applied commit carries the file it came from, so export maps commits back to stable numbers
# even after amends and reorders; export strips the line again.
MARKER = "Vpatch-File"
_MARKER_LINE = re.compile(rb"^Vpatch-File: (\S+)\n", re.M)
STATE_FILE = "tree.json"


@dataclass(frozen=True)
class AppliedPatch:
    file: str
    commit: str


@dataclass(frozen=True)
class Stack:
    """A work tree holding base + one commit per patch, as recorded by apply."""

    worktree: Path
    upstream: Path
    ref: str
    base: str
    applied: tuple[AppliedPatch, ...]

    @property
    def tip(self) -> str:
        return self.applied[-1].commit if self.applied else self.base

    def to_json(self) -> str:
        return json.dumps(
            {
                "worktree": str(self.worktree), "upstream": str(self.upstream), "ref": self.ref,
                "base": self.base, "applied": [{"file": a.file, "commit": a.commit} for a in self.applied],
            },
            indent=2,
        ) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Stack:
        data = json.loads(text)
        return cls(
            worktree=Path(data["worktree"]), upstream=Path(data["upstream"]), ref=data["ref"], base=data["base"],
            applied=tuple(AppliedPatch(a["file"], a["commit"]) for a in data["applied"]),
        )


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
    if moves_from is not None and moves_from != base:
        series = _following_moves(upstream, series, moves_from, base)
    _prepare_out(upstream, original, out, state_dir, force=force)
    tmp = out.parent / f".{out.name}.partial"
    # a killed apply, or a state folder deleted by hand, leaves registrations (maybe locked) of both paths
    shutil.rmtree(tmp, ignore_errors=True)
    git.forget_worktrees(upstream, tmp, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    git.add_worktree(upstream, tmp, base)
    applied: list[AppliedPatch] = []
    try:
        for patch in series:
            failure = _apply_one(tmp, patch)
            if failure is not None:
                if keep:
                    _record(state_dir, Stack(out.resolve(), upstream, ref, base, tuple(applied)))
                    git.move_worktree(upstream, tmp, out)
                raise _apply_error(failure, ref=ref, kept=out if keep else None)
            applied.append(AppliedPatch(patch.filename, git.head(tmp)))
    except BaseException:
        if git.is_repo(tmp):
            git.remove_worktree(upstream, tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # The record first: a kill before the move leaves a record of a missing tree (apply makes it again),
    # never a tree without a record (which the next apply would refuse to replace).
    stack = Stack(out.resolve(), upstream, ref, base, tuple(applied))
    _record(state_dir, stack)
    git.move_worktree(upstream, tmp, out)
    return stack


def _following_moves(upstream: Path, series: Series, pin: str, base: str) -> Series:
    reads = sorted({fd.old_path for patch in series for fd in patch.files if fd.old_path})
    found = moves.follow(upstream, pin, base, moves.missing_paths(upstream, pin, base, reads))
    return replace(series, patches=tuple(moves.retarget(p, found) for p in series)) if found else series


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


def _apply_error(failure: Failure, *, ref: str, kept: Path | None) -> ApplyError:
    where = "; ".join(failure.hunks) or ", ".join(failure.files) or "see git's output below"
    msg = f"patch {failure.patch.filename} does not apply to {ref}: {where}"
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
        name, raw = _strip_marker(git.format_patch(tree, commit))
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


def _record(state_dir: Path, stack: Stack) -> None:
    atomic_write(state_dir / STATE_FILE, stack.to_json().encode())


def load_stack(state_dir: Path, *, required: bool = True) -> Stack | None:
    path = state_dir / STATE_FILE
    if not path.is_file():
        if required:
            raise VpatchError("no applied tree to export from", hint="vpatch apply first, edit the commits there, then vpatch export")
        return None
    try:
        return Stack.from_json(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise VpatchError(
            f"{path} (the record of the applied tree) is unreadable: {exc}",
            hint="save any work in that tree with git format-patch, then vpatch apply --force to rebuild it",
        ) from exc


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
                _, raw = _strip_marker(git.format_patch(stack.worktree, record.commit))
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


def export_series(series: Series, state_dir: Path, *, dry_run: bool = False) -> ExportResult:
    """Write the commits of the applied tree back to numbered files; nothing is written on error."""
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
    next_number = series.next_number()
    # A commit without the marker keeps the name it was first exported under: by its SHA, or (amended since)
    # by the slug of its subject among the names recorded for commits that are gone.
    recorded = {a.commit: a.file for a in stack.applied}
    gone = [a.file for a in stack.applied if a.commit not in commits]
    outputs: dict[str, bytes] = {}
    sources: dict[str, str] = {}
    marked: set[str] = set()  # commits that carry their file's marker (applied by vpatch, or `vpatch new`)
    for c in commits:
        raw = git.format_patch(tree, c)
        name, raw = _strip_marker(raw)
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
    result = ExportResult(unchanged, changed, added, removed, {n: outputs[n] for n in changed + added},
                          rewritten=tuple(broken), unmarked=unmarked)
    if dry_run:
        return result
    # The record first: it fixes each new commit's number, so an export killed half-way and run again
    # writes the same files under the same names. Each file is replaced atomically.
    applied = tuple(AppliedPatch(n, c) for n, c in zip(outputs, commits))
    _record(state_dir, Stack(stack.worktree, stack.upstream, stack.ref, stack.base, applied))
    for name in changed + added:
        atomic_write(series.directory / name, outputs[name])
    for name in removed:
        (series.directory / name).unlink()
    return result


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
            raise SeriesError(f"commit {sources[name][:12]} would export as {name} with the trailer '{line}': "
                              f"{wrong}{more}; nothing was written",
                              hint=f"{todo}: `git commit --amend` in the applied tree, then vpatch export")


def _find_diff_start(raw: bytes) -> int:
    return 0 if raw.startswith(b"diff --git ") else raw.find(b"\ndiff --git ")


def _is_series_name(name: str) -> bool:
    return PATCH_NAME.match(name) is not None


def _strip_marker(raw: bytes) -> tuple[str | None, bytes]:
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
