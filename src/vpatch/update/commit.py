"""Build the project commit as objects, move the branch (the one commit point, journaled), check it out."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from vpatch import git, stack
from vpatch.fs import atomic_write
from vpatch.retired import RETIRED_FILE, NarrowedPatch, RetiredPatch, with_entries
from vpatch.series import Series
from vpatch.update.journal import JOURNAL_FILE, Project, State, checkpoint, discard
from vpatch.update.plan import Action, Outcome, Plan, ProbeCheck, Result, commit_message


def commit_update(project: Project, series: Series, state: State, plan: Plan, exported: stack.ExportResult,
            probes: tuple[ProbeCheck, ...]) -> Result:
    """Build the project commit as objects, then move the branch (the commit point), then check it out."""
    config, top = project.config, project.top
    old = state.head
    writes = {project.path(f"{config.patches}/{name}"): data for name, data in exported.writes.items()}
    removes = [project.path(f"{config.patches}/{f}") for f in plan.files(Action.DROP)]
    retired = _retired_entries(project, series, plan, old)
    if retired:
        record = project.path(f"{config.patches}/{RETIRED_FILE}")
        current = git.read_blobs(top, old, [record])[record]
        writes[record] = with_entries(current, retired)
    from vpatch.config import repin_text

    yaml_path = project.path("vpatch.yaml")
    current_yaml = git.read_blobs(top, old, [yaml_path])[yaml_path] or config.dump().encode()
    writes[yaml_path] = repin_text(current_yaml.decode("utf-8"), plan.to_ref, plan.to_commit).encode()
    message = commit_message(plan, probes)
    tree = git.tree_with(top, old, writes, removes)
    checkpoint("prepared")
    if state.no_commit:
        git.switch_tree(top, old, tree)
        discard(project, Path(state.repo))
        return Result(Outcome.STAGED, plan, message=message, probes=probes)
    new = git.commit_tree(top, tree, [old], message)
    journal: dict[str, Any] = {"ref": state.head_ref, "old": old, "new": new, "repo": state.repo, "plan": plan.to_dict(),
               "message": message}
    atomic_write(project.work / JOURNAL_FILE, (json.dumps(journal, indent=2) + "\n").encode())
    git.update_refs(top, [git.RefUpdate(state.head_ref, new, old)])
    checkpoint("committed")
    return replace(finish_commit(project, journal), probes=probes)


def finish_commit(project: Project, journal: dict[str, Any]) -> Result:
    """After the ref moved: bring the index and files to the new commit, then forget the update."""
    old, new = str(journal["old"]), str(journal["new"])
    git.switch_tree(project.top, old, new)
    (project.work / JOURNAL_FILE).unlink()
    discard(project, Path(str(journal["repo"])))
    plan = Plan.from_dict(journal["plan"])
    return Result(Outcome.COMMITTED, plan, commit=new, message=str(journal["message"]))


def _retired_entries(project: Project, series: Series, plan: Plan, head: str) -> list[RetiredPatch | NarrowedPatch]:
    entries: list[RetiredPatch | NarrowedPatch] = []
    for row in plan.patches:
        patch = series.get(row.file.removesuffix(".patch"))
        if row.narrowing is not None:
            from vpatch.narrow import record

            entries.append(record(patch, row.narrowing, retired_by=f"update {plan.from_ref} -> {plan.to_ref}",
                                  last_version=f"{head[:12]}:{project.path(f'{project.config.patches}/{row.file}')}"))
        if row.action is not Action.DROP:
            continue
        entries.append(RetiredPatch(
            patch.number, patch.slug, patch.subject, row.landed_in or plan.to_ref,
            (f"{row.decided_by} (on {plan.to_ref})",) + tuple(e for e in row.evidence if e != row.decided_by),
            f"update {plan.from_ref} -> {plan.to_ref}",
            f"{head[:12]}:{project.path(f'{project.config.patches}/{row.file}')}", row.upstream_pr,
        ))
    return entries
