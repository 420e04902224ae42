"""Move the pin: drop the patches upstream now has (with evidence), refresh the rest, commit once, or stop on a conflict.

The project is touched only at the very end. Until then the work happens in `.git/vpatch-update/` of the
project's repository: a work tree of the upstream mirror at the new pin holding the kept patches as
commits. A stop on a conflict leaves that folder with `state.json` (like git's rebase state) for
`--continue` / `--abort`. The project commit is built as objects first; moving the branch ref is the one
commit point, journaled in `commit.json` so that a kill right after it can be finished or undone.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch import git, upstream
from vpatch.base import ApplyError, Reporter, VpatchError, silent
from vpatch.probes import Witness
from vpatch.series import Patch, Series
from vpatch.tree import apply_series, commit_patch, export_series, load_stack
from vpatch.update import furthest, guard, handwork, resolution, retarget
from vpatch.update.commit import commit_update, finish_commit, undo_commit
from vpatch.update.disposition import as_applied, dispose, follow_probes, judge_with_status, refusal, without_probes
from vpatch.update.journal import (
    JOURNAL_FILE,
    STATE_FILE,
    Project,
    UpdateState,
    clear_stale,
    discard,
    load_journal,
    load_state,
    refuse_dirty,
    refuse_in_progress,
    save_state,
)
from vpatch.update.plan import (
    Action,
    Judge,
    PatchPlan,
    Result,
    Revalidation,
    Stop,
    UpdateOutcome,
    UpdatePlan,
    Validator,
)

if TYPE_CHECKING:
    from vpatch.config import Config
    from vpatch.status import Status


def update(
    config: Config, to: str, *, dry_run: bool = False, no_commit: bool = False, allow_downgrade: bool = False,
    judge: Judge | None = None, validator: Validator | None = None, narrow: bool = True,
    evidence: Witness | None = None,
) -> Result:
    """Move the pin to `to`; see the module docstring. Raises VpatchError and leaves the project as it was,
    or, past the commit point, with the journal that --continue / --abort act on. `evidence`: the command's
    Witness, whose session the per-hunk coverage of a narrowing shares (None: one of its own)."""
    project = Project.open(config)
    with git.project_lock(project.top, "update"):
        return _update(project, to, dry_run=dry_run, no_commit=no_commit, allow_downgrade=allow_downgrade,
                       judge=judge, validator=validator, narrow=narrow, evidence=evidence)


def update_furthest(
    config: Config, to: str, *, dry_run: bool = False, no_commit: bool = False, judge: Judge | None = None,
    validator: Validator | None = None, narrow: bool = True, progress: Reporter | None = None,
    evidence: Witness | None = None,
) -> furthest.Reach:
    """`update --to TARGET --furthest`: choose the newest step toward `to` where the update succeeds without a
    person (furthest.py), then one update to it, atomic like any other; the lock is held for both. `judge`, when
    given, judges every check (tests); by default the bisection's checks skip the landing search. `evidence`: the
    command's Witness, whose session every judging shares (its trees extracted once, one warm interpreter); None:
    each judging has one of its own, each probe run alone."""
    project = Project.open(config)
    with git.project_lock(project.top, "update"):
        return _furthest(project, to, dry_run=dry_run, no_commit=no_commit, judge=judge, validator=validator,
                         narrow=narrow, progress=progress, evidence=evidence)


def _furthest(
    project: Project, to: str, *, dry_run: bool, no_commit: bool, judge: Judge | None, validator: Validator | None,
    narrow: bool, progress: Reporter | None, evidence: Witness | None = None,
) -> furthest.Reach:

    config = project.config
    refuse_in_progress(project)
    if not dry_run:
        refuse_dirty(project)
    repo = upstream.open_upstream(config)
    target = upstream.resolve(repo, to)
    current = upstream.pin_commit(repo, config)
    goal = furthest.Candidate(to, target)
    if target == current:
        return furthest.Reach(furthest.Choice(goal, "releases", (), goal, ()),
                              Result(UpdateOutcome.UP_TO_DATE, UpdatePlan(config.pin.ref, current, to, target, ())))
    guard.refuse_downgrade(repo, config, current, to, target)
    mode, line = furthest.candidates(repo, config, current=current, to=to, target=target)
    series = Series.load(config.patches_dir)
    judged: dict[tuple[str, bool], tuple[list[PatchPlan], Status | None]] = {}

    def judge_at(cand: furthest.Candidate, *, landing: bool) -> tuple[list[PatchPlan], Status | None]:
        # each commit is judged once per kind; the full check and the real run share the judging
        key = (cand.commit, landing)
        if key in judged:
            return judged[key]
        if judge is not None:
            judged[key] = judge(repo, config, series, current, cand.ref, cand.commit)
        else:
            judged[key] = judge_with_status(repo, config, series, current, cand.ref, cand.commit, progress=progress,
                                            landing=landing, evidence=evidence)
        return judged[key]

    def by_judging(cand: furthest.Candidate) -> furthest.CandidateCheck:
        rows, report = judge_at(cand, landing=False)
        rows = without_probes(repo, config, series, rows, report, current=current, to=cand.ref, target=cand.commit,
                              narrow_them=narrow)
        blockers = furthest.blockers_of(rows, cand, to)
        return furthest.CandidateCheck(cand, not blockers, False, blockers)

    planned: dict[str, Result] = {}

    def memo(_repo: Path, _config: Config, _series: Series, _current: str, ref: str,
             commit: str) -> tuple[list[PatchPlan], Status | None]:
        return judge_at(furthest.Candidate(ref, commit), landing=True)

    def in_full(cand: furthest.Candidate) -> furthest.CandidateCheck:
        # every disposition there, as the real run decides them; a refused one is a blocker like a stop
        plan = _plan(project, repo, series, current, cand.ref, cand.commit, judge=memo, validator=validator,
                     narrow=narrow, evidence=evidence)
        planned[cand.commit] = Result(UpdateOutcome.PLANNED, plan, probes=_probes_of(plan))
        blockers = furthest.blockers_of(plan.patches, cand, to)
        return furthest.CandidateCheck(cand, not blockers, True, blockers)

    choice = furthest.choose(goal, mode, line, judged=by_judging, full=in_full, report=progress or silent)
    if choice.step is None:
        return furthest.Reach(choice, Result(UpdateOutcome.BLOCKED, UpdatePlan(config.pin.ref, current, config.pin.ref, current, ())))
    ahead = choice.ahead_lines()
    if dry_run:
        result = planned[choice.step.commit]
        return furthest.Reach(choice, replace(result, plan=replace(result.plan, ahead=ahead)))
    # the real run carries out the plan the full check made, nothing else
    return furthest.Reach(choice, _update(project, choice.step.ref, dry_run=False, no_commit=no_commit,
                                          allow_downgrade=False, judge=memo, validator=validator, narrow=narrow,
                                          ahead=ahead, planned=planned[choice.step.commit].plan))


def _update(
    project: Project, to: str, *, dry_run: bool, no_commit: bool, allow_downgrade: bool, judge: Judge | None,
    validator: Validator | None, narrow: bool, ahead: tuple[str, ...] = (), planned: UpdatePlan | None = None,
    evidence: Witness | None = None,
) -> Result:

    config = project.config
    refuse_in_progress(project)
    if not dry_run:  # a dry run writes nothing: it plans with the files as they are
        refuse_dirty(project)
    repo = upstream.open_upstream(config)
    target = upstream.resolve(repo, to)
    current = upstream.pin_commit(repo, config)
    if target == current:
        return Result(UpdateOutcome.UP_TO_DATE, UpdatePlan(config.pin.ref, current, to, target, ()))
    if not allow_downgrade:
        guard.refuse_downgrade(repo, config, current, to, target)
    series = Series.load(config.patches_dir)
    plan = replace(planned or _plan(project, repo, series, current, to, target, judge=judge, validator=validator,
                                    narrow=narrow, evidence=evidence), ahead=ahead)
    # the dry run and the real run refuse alike: a plan saying "would drop" where the real run refuses would be a
    # promise it does not keep
    refused = refusal(plan)
    if refused is not None:
        raise guard.Refused(refused, plan)
    if dry_run:
        return Result(UpdateOutcome.PLANNED, plan, probes=_probes_of(plan))
    clear_stale(project, repo)
    try:
        state = UpdateState(plan=plan, head=git.head(project.top), head_ref=git.head_ref(project.top), repo=str(repo),
                      no_commit=no_commit, pending=plan.files(Action.CARRY, Action.NARROW, Action.STOP))
        return _run(project, series, state, validator)
    except BaseException:
        # past the commit point the journal is the way back (or forward): keep it and the update tree
        if not (project.work / JOURNAL_FILE).exists():
            discard(project, repo)
        raise


def _plan(project: Project, repo: Path, series: Series, current: str, to: str, target: str, *, judge: Judge | None,
          validator: Validator | None, narrow: bool, evidence: Witness | None = None) -> UpdatePlan:
    """Every patch's disposition on `target` (disposition.py): the plan the update carries out."""
    config = project.config
    rows, report = (judge or judge_with_status)(repo, config, series, current, to, target)
    rows = dispose(repo, config, series, rows, report, current=current, to=to, target=target,
                   validator=lambda r, c, p, b, t: _validate(r, c, p, b, t, validator), narrow_them=narrow,
                   evidence=evidence)
    return UpdatePlan(config.pin.ref, current, to, target, tuple(rows), report)


def _probes_of(plan: UpdatePlan) -> tuple[Revalidation, ...]:
    """The probes the dispositions re-validated on the new pin, as the real run reports them."""
    return tuple(Revalidation(p.file, p.validated, True, p.validated_detail) for p in plan.patches if p.validated)


def resume(config: Config, *, validator: Validator | None = None) -> Result:
    """`--continue`: finish an interrupted commit; or commit the resolved patch in the update tree, apply the
    rest, finish."""
    project = Project.open(config)
    with git.project_lock(project.top, "update"):
        return _resume(project, validator)


def _resume(project: Project, validator: Validator | None) -> Result:
    """--continue, one step each: what a person did during the stop is taken in or refused (nothing of it is
    lost either way), then the resolution is committed as rewritten by hand, then the rest of the update runs."""
    config = project.config
    journal = load_journal(project)
    if journal is not None:
        return finish_commit(project, journal)
    state = load_state(project)
    notes: list[str] = []
    state = handwork.take_in_commits(project, state, notes)
    handwork.refuse_uncommitted(project)
    series = Series.load(config.patches_dir)
    state = handwork.take_in_hand_edit(project, state, series, notes)
    handwork.refuse_unresolved(project)
    state = handwork.commit_resolution(project, state, series)
    result = _run(project, series, state, validator)
    return replace(result, notes=(*notes, *result.notes))


def abort(config: Config) -> Result:
    """`--abort`: throw the update tree and state away, after setting the person's work in it aside (replayed
    by the next update that stops at that patch); undo the project commit if a kill interrupted it."""
    project = Project.open(config)
    with git.project_lock(project.top, "update"):
        journal = load_journal(project)
        if journal is not None:
            undo_commit(project, journal)
            discard(project, Path(journal.repo))
            return Result(UpdateOutcome.ABORTED, journal.plan)
        if not (project.work / STATE_FILE).exists():
            raise VpatchError("no update in progress", hint="vpatch update --to REF starts one")
        try:
            state: UpdateState | None = load_state(project)
        except VpatchError:
            state = None  # unreadable: nothing was committed before a stop, so throwing it away is safe
        stale = load_stack(project.work, required=False)
        kept = handwork.keep_work(project, state, stale)
        repo = Path(state.repo) if state is not None else stale.upstream if stale is not None else None
        shutil.rmtree(project.work, ignore_errors=True)
        if repo is not None:
            git.forget_worktrees(repo, project.work)
        plan = state.plan if state is not None else UpdatePlan(config.pin.ref, config.pin.commit or "", "(unknown)", "", ())
        notes = [kept.words() + f"; the next update that stops at {kept.file[:4]} replays it"] if kept else []
        return Result(UpdateOutcome.ABORTED, plan, notes=tuple(notes))


def _run(project: Project, series: Series, state: UpdateState, validator: Validator | None) -> Result:
    """Apply the pending patches in the update tree, then finish; or stop on the first that needs a person."""
    config, repo, plan = project.config, Path(state.repo), state.plan
    originals = {p.filename: p for p in series}
    by_file = as_applied(series, plan)
    kept = [by_file[f] for f in plan.files(Action.CARRY, Action.NARROW, Action.STOP)]
    if not project.tree.exists():
        done = _start_tree(project, repo, plan, kept, state.pending)
    else:
        # a --continue killed after committing more patches: those are in the tree already, never twice
        recorded = load_stack(project.work, required=False)
        done = {a.file for a in recorded.applied} if recorded is not None else set()
    state = replace(state, pending=[f for f in state.pending if f not in done])
    for i, file in enumerate(list(state.pending)):
        row = next(p for p in plan.patches if p.file == file)
        stopped, replayed, conflicted = _apply_next(project, by_file[file], row, plan)
        if stopped is not None:
            why = f"{row.state} in {', '.join(conflicted)}" if conflicted else row.state
            state = replace(state, pending=state.pending[i:], why=why + ("; your kept resolution replayed"
                                                                         if replayed else ""),
                            left=handwork.tree_digest(project),
                            replayed=[*state.replayed, file] if replayed else state.replayed)
            save_state(project, state)
            notes = (f"replayed {replayed.what()}, kept in {replayed.folder} since an update to {replayed.to_ref}: "
                     "it applies here as it is (as git rerere replays a recorded resolution); it is staged in the "
                     "update tree: check it, then `vpatch update --continue`",) \
                if replayed else ()
            return Result(UpdateOutcome.STOPPED, plan, stop=stopped, notes=notes)
    state = replace(state, pending=[])
    applied = load_stack(project.work)
    assert applied is not None
    proofs = retarget.prove(repo, project.work, applied, originals, plan.patches)
    plan = replace(plan, patches=tuple(replace(p, move_proof=proofs[p.file]) if p.file in proofs else p
                                       for p in plan.patches))
    plan, checked = follow_probes(project.work, repo, plan, originals, by_file)
    refused = refusal(plan)
    if refused is not None:
        raise refused
    probes = tuple(_validate(repo, config, checked[a.file], applied.base, a.commit, validator) for a in applied.applied)
    failed = [p for p in probes if not p.ok]
    if failed:
        raise guard.unvalidated(failed, plan.to_ref)
    exported = export_series(Series(series.directory, tuple(originals[p.filename] for p in kept), series.retired),
                                   project.work, dry_run=True, check_edits=False)
    for file in exported.changed:
        plan = plan.exported(file, changed=True)
    for file in exported.unchanged:
        plan = plan.exported(file, changed=False)
    done_result = commit_update(project, series, state, plan, exported, probes)
    resolution.forget(project, [f for f in state.resolved if f in state.replayed])  # in the project's commit now
    return done_result


def _start_tree(project: Project, repo: Path, plan: UpdatePlan, kept: list[Patch], pending: list[str]) -> set[str]:
    """The update tree: the new pin with the kept patches that apply plainly, up to the first that does not;
    returns the files committed there."""
    clean_prefix: list[Patch] = []
    actions = {p.file: p.action for p in plan.patches}
    for patch in kept:
        if patch.filename not in pending or actions[patch.filename] is Action.STOP:
            break
        clean_prefix.append(patch)
    # apply_series is all-or-nothing unless kept; keep=True leaves the tree with the patches before a failure.
    try:
        apply_series(repo, Series(project.config.patches_dir, tuple(clean_prefix)), ref=plan.to_ref,
                           base=plan.to_commit, out=project.tree, state_dir=project.work, keep=True)
    except ApplyError:
        pass  # _apply_next goes on from the failing patch, 3-way
    applied = load_stack(project.work)
    assert applied is not None
    return {a.file for a in applied.applied}


def _apply_next(project: Project, patch: Patch, row: PatchPlan,
                plan: UpdatePlan) -> tuple[Stop | None, resolution.Kept | None, tuple[str, ...]]:
    """Commit one patch in the update tree: plainly, else by a clean 3-way merge; else leave the conflict (its
    markers named, upstream's side listed) or a resolution kept from an earlier stop, and stop. Returns the stop,
    the resolution replayed, and the paths that conflicted."""
    tree, to_ref = project.tree, plan.to_ref
    recorded = load_stack(project.work)
    assert recorded is not None
    if row.action is not Action.STOP and git.apply_to_worktree(tree, patch.diff).returncode == 0:
        commit_patch(tree, patch)
        handwork.record_applied(project, recorded, patch)
        return None, None, ()
    merged = git.apply_to_worktree(tree, patch.diff, three_way=True)
    conflicts = tuple(git.unmerged_paths(tree))
    if merged.returncode == 0 and not conflicts and row.action is not Action.STOP:
        commit_patch(tree, patch)
        handwork.record_applied(project, recorded, patch)
        return None, None, ()
    if row.action is Action.STOP:
        reason = f"{row.file} is {row.state} on {to_ref}: {row.decided_by}" + (f"\n{row.note}" if row.note else "")
    else:
        reason = f"{row.file} does not apply on {to_ref}, not even with a clean 3-way merge"
    if merged.returncode != 0 and not conflicts:
        reason += "\n" + merged.err.strip()
    found = resolution.kept(project, row.file)
    if found is not None and not found.unresolved:
        git.discard_changes(tree)
        replayed = resolution.replay(project, row.file)
        if replayed is not None:  # the conflict is gone from the tree: the stop says where it was
            return Stop(row.file, row.state, tree, (), reason), replayed, conflicts
        # it does not apply here: the merge comes back for the person, and the kept resolution stays kept
        git.apply_to_worktree(tree, patch.diff, three_way=True)
        conflicts = tuple(git.unmerged_paths(tree))
    if found is not None:
        reason += (f"\n{found.what()}, kept in {found.folder} since an update to {found.to_ref}, "
                   + ("is not replayed (conflict markers left in it)" if found.unresolved else
                      f"does not apply on {to_ref} as it is (upstream changed those lines again)")
                   + ": it stays there to read")
    if conflicts:
        resolution.label_conflicts(tree, conflicts, ours=handwork.ours_label(to_ref), theirs=row.file)
        side = resolution.upstream_side(recorded.upstream, tree, conflicts, plan.from_commit, plan.to_commit)
        reason += (f"\nconflict markers: <<<<<<< {handwork.ours_label(to_ref)} ... >>>>>>> {row.file}"
                   f"\nupstream changed these lines between {plan.from_ref} and {to_ref}: "
                   + ("; ".join(side) if side else "no commit found (the conflict is with an earlier patch)"))
    return Stop(row.file, row.state, tree, conflicts, reason), None, conflicts


def _validate(repo: Path, config: Config, patch: Patch, base: str, patched: str, validator: Validator | None) -> Revalidation:
    if patch.probe_path is None:
        return Revalidation(patch.filename, None, True, "no probe")
    return (validator or validate_with_probes)(repo, config, patch, base, patched)


def validate_with_probes(repo: Path, config: Config, patch: Patch, base: str, patched: str, *,
                         evidence: Witness | None = None) -> Revalidation:
    """Witness.validate: the probe must fail on `base` and pass on `patched` (a ProbeError when it does not).
    `evidence`: the command's Witness (default: one of its own, each probe run alone)."""

    witness = evidence if evidence is not None else Witness(repo, config)
    outcome = witness.validate(patch, base=base, patched=patched, repo=repo)
    return Revalidation(patch.filename, patch.trailer("Probe"), outcome.ok, outcome.detail)
