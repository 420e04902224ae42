"""Build the project commit as objects, move the branch (the one commit point, journaled), check it out."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from vpatch import git
from vpatch.base import GitError, VpatchError, atomic_write
from vpatch.config import repin_text
from vpatch.series import RETIRED_FILE, NarrowedPatch, RetiredPatch, Series, with_entries
from vpatch.tree import ExportResult
from vpatch.update.journal import (
    JOURNAL_FILE,
    CommitJournal,
    Project,
    UpdateState,
    discard,
    save_journal,
)
from vpatch.update.narrow import record
from vpatch.update.plan import Action, Result, Revalidation, UpdateOutcome, UpdatePlan, commit_message
from vpatch.update.probefollow import probe_writes


def commit_update(project: Project, series: Series, state: UpdateState, plan: UpdatePlan, exported: ExportResult,
            probes: tuple[Revalidation, ...]) -> Result:
    """Build the project commit as objects, then move the branch (the commit point), then check it out."""
    config, top = project.config, project.top
    old = state.head
    writes = {project.path(f"{config.patches}/{name}"): data for name, data in exported.writes.items()}
    removes = [project.path(f"{config.patches}/{f}") for f in plan.files(Action.DROP)]
    gone_probes = _retired_probe_files(project, series, plan, old)
    removes += gone_probes

    kept = [p for p in series.patches if p.filename not in plan.files(Action.DROP)]
    moved_probes = probe_writes(Path(state.repo), config.root, project.rel, kept, {p.file: p for p in plan.patches},
                                pin=plan.from_commit, target=plan.to_commit)
    writes.update(moved_probes)
    retired = _retired_entries(project, series, plan, old)
    if retired:
        record = project.path(f"{config.patches}/{RETIRED_FILE}")
        current = git.read_blobs(top, old, [record])[record]
        writes[record] = with_entries(current, retired)

    yaml_path = project.path("vpatch.yaml")
    current_yaml = git.read_blobs(top, old, [yaml_path])[yaml_path] or config.dump().encode()
    writes[yaml_path] = repin_text(current_yaml.decode("utf-8"), plan.to_ref, plan.to_commit).encode()
    message = commit_message(plan, probes)
    if state.resolved:
        message += _rewritten_lines(plan, state, probes)
    if gone_probes:
        message += "\nProbe files retired with their patches:\n" + "".join(f"- {p}\n" for p in gone_probes)
    if moved_probes:
        message += "\nFiles probes re-targeted to the moved paths (their keys rewritten):\n" + "".join(
            f"- {name}\n" for name in sorted(moved_probes))
    tree = git.tree_with(top, old, writes, removes)
    if state.no_commit:
        git.switch_tree(top, old, tree)
        discard(project, Path(state.repo))
        return Result(UpdateOutcome.STAGED, plan, message=message, probes=probes)
    new = git.commit_tree(top, tree, [old], message)
    journal = CommitJournal(state.head_ref, old, new, state.repo, plan, message)
    # The journal goes first: from here on a kill or an error leaves it for --continue / --abort.
    save_journal(project, journal)
    try:
        git.update_refs(top, [git.RefUpdate(state.head_ref, new, old)])
    except GitError as exc:
        if _branch_at(project, state.head_ref) != old:
            raise
        (project.work / JOURNAL_FILE).unlink()  # nothing moved: the caller's cleanup leaves the project as it was
        raise VpatchError(f"could not move {state.head_ref} to the update's commit; the project is unchanged\n"
                          f"{exc.message}", hint="is another git command running in the project? then run the "
                          "update again") from None
    return replace(finish_commit(project, journal), probes=probes)


def finish_commit(project: Project, journal: CommitJournal) -> Result:
    """Complete a journaled commit wherever it was interrupted: move the branch if it has not moved yet,
    bring the index and files to the new commit, then forget the update."""
    ref, old, new = journal.ref, journal.old, journal.new
    at = _branch_at(project, ref)
    if at == old:
        git.update_refs(project.top, [git.RefUpdate(ref, new, old)])  # interrupted just before the commit point
    elif at != new:
        raise VpatchError(
            f"{_name(ref)} is at {(at or 'nothing')[:12]}: neither where the interrupted update started ({old[:12]}) "
            f"nor its commit ({new[:12]}); something else moved it meanwhile",
            hint="vpatch update --abort forgets the interrupted update (the branch stays where it is), then "
                 "start the update again")
    if not git.index_matches(project.top, new):
        _switch(project, old, new, ref, undo=False)
    discard(project, Path(journal.repo))
    return Result(UpdateOutcome.COMMITTED, journal.plan, commit=new, message=journal.message)


def undo_commit(project: Project, journal: CommitJournal) -> None:
    """Put the branch, the index and the files back where a journaled commit found them (files first, so
    that an undo that fails half-way can be run again)."""
    ref, old, new = journal.ref, journal.old, journal.new
    at = _branch_at(project, ref)
    if at not in (old, new):
        discard(project, Path(journal.repo))
        if at is None or not git.is_ancestor(project.top, new, at):
            return  # the update's commit never reached the branch: nothing of it to undo
        raise VpatchError(
            f"{_name(ref)} moved on to {(at or 'nothing')[:12]} since the update was interrupted; the update's "
            f"commit {new[:12]} was not undone (the interrupted update is forgotten)",
            hint=f"`git log {_name(ref)}` shows whether {new[:12]} is in it; `git revert {new[:12]}` undoes its change")
    if git.index_matches(project.top, new) and not git.index_matches(project.top, old):
        _switch(project, new, old, ref, undo=True)  # the check-out had happened: put the files back
    elif git.index_matches(project.top, old):
        _undo_half_checkout(project, old, new)  # killed inside the check-out: files it wrote go back
    if at == new:
        git.update_refs(project.top, [git.RefUpdate(ref, old, new)])


def _switch(project: Project, old: str, new: str, ref: str, *, undo: bool) -> None:
    """Two-way check-out of the project from `old` to `new`; a failure is explained, the journal stays."""
    try:
        try:
            git.switch_tree(project.top, old, new)
        except GitError:
            if not _undo_half_checkout(project, old, new):
                raise
            git.switch_tree(project.top, old, new)
    except GitError as exc:
        lock = project.git_dir / "index.lock"
        if lock.exists():
            why, fix = (f"another git process holds {lock}",
                        f"when no git command is running in the project, delete {lock}")
        else:
            why, fix = ("local changes are in the way:\n" + exc.output.strip(),
                        "commit or stash (git stash) those changes")
        if undo:
            raise VpatchError(f"could not undo the update's check-out: {why}",
                              hint=f"{fix}, then vpatch update --abort again") from None
        raise VpatchError(f"the update's commit {new[:12]} is on {_name(ref)}, but the project's files could not be "
                          f"brought to it: {why}",
                          hint=f"{fix}, then vpatch update --continue to finish (or vpatch update --abort to undo "
                               "the update)") from None


def _undo_half_checkout(project: Project, old: str, new: str) -> bool:
    """A kill inside git's own check-out can leave some files at `new` while the index still holds `old`.
    Recognised when every changed file is one the update changes and holds exactly its old or its new
    content (nothing of the user's): those files are put back at `old`, for the check-out to run again."""
    top = project.top
    if (project.git_dir / "index.lock").exists():
        return False
    changed = set(git.paths_differing(top, old, new))
    dirty = git.dirty_paths(top)
    if not dirty or not set(dirty) <= changed:
        return False
    before, after = git.read_blobs(top, old, dirty), git.read_blobs(top, new, dirty)
    written = []
    for path in dirty:
        file = top / path
        data = file.read_bytes() if file.is_file() and not file.is_symlink() else None
        if data not in (before[path], after[path]):
            return False
        if data != before[path]:
            written.append(path)
    if not written:
        return False
    for path in written:
        content = before[path]
        if content is None:
            (top / path).unlink(missing_ok=True)
        else:
            atomic_write(top / path, content)
    # the rewritten files have new stat data: a two-way read-tree trusts only a refreshed index
    git.refresh_index(top)
    return True


def _branch_at(project: Project, ref: str) -> str | None:
    return git.resolve_commit(project.top, ref)


def _name(ref: str) -> str:
    return ref.removeprefix("refs/heads/")


def _retired_entries(project: Project, series: Series, plan: UpdatePlan, head: str) -> list[RetiredPatch | NarrowedPatch]:
    entries: list[RetiredPatch | NarrowedPatch] = []
    for row in plan.patches:
        patch = series.get(row.file.removesuffix(".patch"))
        if row.narrowing is not None:

            entries.append(record(patch, row.narrowing, retired_by=f"update {plan.from_ref} -> {plan.to_ref}",
                                  last_version=f"{head[:12]}:{project.path(f'{project.config.patches}/{row.file}')}"))
        if row.action is not Action.DROP:
            continue
        entries.append(RetiredPatch(
            patch.number, patch.slug, patch.subject, row.landed_in or plan.to_ref,
            (f"{row.decided_by} (on {plan.to_ref})", *(e for e in row.evidence if e != row.decided_by)),
            f"update {plan.from_ref} -> {plan.to_ref}",
            f"{head[:12]}:{project.path(f'{project.config.patches}/{row.file}')}", row.upstream_pr,
            live_check=patch.live_check,
        ))
    return entries


def _retired_probe_files(project: Project, series: Series, plan: UpdatePlan, head: str) -> list[str]:
    """The files of a dropped patch's probe (its YAML, and the files beside it named after it, such as its
    script): they leave with the patch, unless a kept patch's probe names them too. RETIRED.md's last version
    of the patch (a commit) still reaches them."""
    dropped = [series.get(f.removesuffix(".patch")) for f in plan.files(Action.DROP)]
    kept = [p for p in series if p.filename not in plan.files(Action.DROP)]
    keep = {p.probe_path.with_suffix("") for p in kept if p.probe_path is not None}
    gone: list[str] = []
    for patch in dropped:
        probe = patch.probe_path
        if probe is None or probe.with_suffix("") in keep:
            continue
        folder = probe.parent
        stem = probe.with_suffix("").name
        for path in sorted(folder.glob(f"{stem}.*")):
            rel = project.path(path.relative_to(project.config.root).as_posix())
            if git.read_blobs(project.top, head, [rel])[rel] is not None:  # committed, so the commit removes it
                gone.append(rel)
    return gone


def _rewritten_lines(plan: UpdatePlan, state: UpdateState, probes: tuple[Revalidation, ...]) -> str:
    """The patches a person rewrote at a stop, and the evidence the rewritten patch passed."""
    checked = {p.file: p for p in probes}
    lines = ["", f"Rewritten by hand for {plan.to_ref} (the update stopped there; resolved, then --continue):"]
    for file in state.resolved:
        probe = checked.get(file)
        evidence = (f"probe {probe.probe} re-validated on {plan.to_ref}: fails without it, passes with it"
                    + (f" ({probe.detail})" if probe.detail else "")) if probe is not None and probe.probe else \
            f"applies on {plan.to_ref} (no probe)"
        lines += [f"- {file}: Rewritten: by hand for {plan.to_ref}; Last-Update moved", f"  Evidence: {evidence}"]
    if state.taken_in:
        lines += [f"Commits made during the stop, taken in: {', '.join(c[:12] for c in state.taken_in)}"]
    return "\n".join(lines) + "\n"
