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
    if moves_from is not None and moves_from != base:
        series = _following_moves(upstream, series, moves_from, base)
    _prepare_out(out, state_dir, force=force)
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
                    git.run(upstream, ["worktree", "move", str(tmp), str(out)])
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
    git.run(upstream, ["worktree", "move", str(tmp), str(out)])
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
    git.run(worktree, ["reset", "--hard", "--quiet", "HEAD"])
    git.run(worktree, ["clean", "-fdq"])
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


def _prepare_out(out: Path, state_dir: Path, *, force: bool) -> None:
    """Refuse to replace a tree that holds work not yet exported, unless forced."""
    if not out.exists():
        return
    if not out.is_dir():
        raise VpatchError(f"{out} exists and is not a folder", hint="choose another --out (a new or empty folder)")
    try:
        stack = load_stack(state_dir, required=False)
    except VpatchError:
        if not force:
            raise
        # The record is unreadable, so nothing tells what the tree holds; --force was asked to throw it away.
        shutil.rmtree(out)
        (state_dir / STATE_FILE).unlink()
        return
    if stack is None or stack.worktree != out.resolve():
        if any(out.iterdir()):
            raise VpatchError(f"{out} exists and is not a vpatch tree", hint="choose another --out, or remove it")
        out.rmdir()
        return
    if not force and git.is_repo(out):
        dirty = git.dirty_paths(out)
        if dirty or git.head(out) != stack.tip:
            raise VpatchError(
                f"{out} holds work that is not exported ({'uncommitted changes' if dirty else 'new or edited commits'})",
                hint="vpatch export first, or pass --force to throw that work away",
            )
    git.remove_worktree(stack.upstream, out)
    shutil.rmtree(out, ignore_errors=True)


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


@dataclass(frozen=True)
class ExportResult:
    unchanged: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    writes: dict[str, bytes] = field(default_factory=dict, repr=False)


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
    for c in commits:
        raw = git.format_patch(tree, c)
        name, raw = _strip_marker(raw)
        if name is None:
            subject = git.run(tree, ["log", "-1", "--format=%s", c]).out.strip()
            name = recorded.get(c) or next((f for f in gone if f[5:] == f"{slugify(subject)}.patch"), None)
            if name in gone:
                gone.remove(name)
        if name is None or name in outputs or not (name in existing or _is_series_name(name)):
            subject = git.run(tree, ["log", "-1", "--format=%s", c]).out.strip()
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
    unchanged = tuple(n for n, raw in outputs.items() if n in existing and existing[n].raw == raw)
    changed = tuple(n for n, raw in outputs.items() if n in existing and existing[n].raw != raw)
    added = tuple(n for n in outputs if n not in existing)
    removed = tuple(n for n in existing if n not in outputs)
    result = ExportResult(unchanged, changed, added, removed, {n: outputs[n] for n in changed + added})
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
            Patch.parse(raw, number=int(m["number"]), slug=m["slug"], path=series.directory / name)
        except SeriesError as exc:
            commit = sources[name][:12]
            if _find_diff_start(raw) < 0:
                raise SeriesError(f"commit {commit} ({name}) changes nothing: it would export as a patch without a diff; "
                                  "nothing was written",
                                  hint="make the change and `git commit --amend` it, or drop the empty commit "
                                       "(git rebase -i), then vpatch export") from None
            raise SeriesError(f"commit {commit} would export as {name}, which vpatch cannot read back: {exc.message}; "
                              "nothing was written", hint=exc.hint) from None


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
