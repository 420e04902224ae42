"""A person's work at a stopped update, taken in by `vpatch update --continue` step by step: what they did during
the stop (a commit in the project, a hand edit of the stopped patch, work in the update tree) is taken in or
refused, with nothing of it lost either way; then the resolution is committed in the update tree as rewritten by
hand. run.py calls the steps in order (`_resume`); each is one function here, so that one more check goes in as
one more line there."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from vpatch import git
from vpatch.base import ApplyError, VpatchError
from vpatch.series import Patch, Series
from vpatch.tree import AppliedPatch, Stack, commit_patch, load_stack, save_stack
from vpatch.update import resolution
from vpatch.update.journal import Project, UpdateState, save_state
from vpatch.update.plan import Action


def take_in_commits(project: Project, state: UpdateState, notes: list[str]) -> UpdateState:
    """Commits made in the project during the stop go under the update's commit, as `git rebase` takes a commit
    made mid-rebase: those that change patches the update tree has not used yet (the stopped one, the ones
    after it) or other files of the project. Refused, nothing touched, when they change what the update has
    already used: the pin, a patch it drops or already applied, a new patch it never planned."""
    top, now = project.top, git.head(project.top)
    if now == state.head:
        return state
    again = "vpatch update --abort (it keeps your resolution in the update tree), then start the update again: " \
            "it plans from the project as it is now and replays the resolution"
    if git.resolve_commit(top, state.head_ref) != now or not git.is_ancestor(top, state.head, now):
        raise VpatchError(f"the project's HEAD moved since the update stopped ({state.head[:12]} -> {now[:12]}) "
                          f"and is not a commit on top of it on {state.head_ref.removeprefix('refs/heads/')}",
                          hint=f"check out {state.head_ref.removeprefix('refs/heads/')} at a commit on top of "
                               f"{state.head[:12]}; or {again}")
    patches = project.path(project.config.patches) + "/"
    recorded = load_stack(project.work, required=False)
    used = {a.file for a in recorded.applied} if recorded is not None else set()
    planned = {p.file for p in state.plan.patches}
    dropped = set(state.plan.files(Action.DROP))
    for path in git.paths_differing(top, state.head, now):
        name = path.removeprefix(patches) if path.startswith(patches) else None
        why = None
        if path == project.path("vpatch.yaml"):
            why = "changes vpatch.yaml (the pin the update moves)"
        elif name is not None and name in dropped:
            why = f"changes {name}, which the update drops"
        elif name is not None and name in used:
            why = f"changes {name}, which the update tree already holds as it was"
        elif name is not None and "/" not in name and name.endswith(".patch") and name not in planned:
            why = f"adds {name}, which the update did not plan"
        if why is not None:
            raise VpatchError(f"a commit made during the stopped update {why}; not taken in, nothing changed",
                              hint=again)
    taken = git.commits_between(top, state.head, now)
    notes.append(f"took in {len(taken)} commit(s) made during the stop ({state.head[:12]}..{now[:12]}): the "
                 "update's commit goes on top of them")
    state = replace(state, head=now, started=state.start, taken_in=[*state.taken_in, *taken])
    save_state(project, state)
    return state


def refuse_uncommitted(project: Project) -> None:
    dirty = git.dirty_paths(project.top, [project.path(project.config.patches), project.path("vpatch.yaml")])
    if dirty:
        raise VpatchError("uncommitted changes in the series or the pin during the stopped update: "
                          + ", ".join(dirty[:5]) + (" ..." if len(dirty) > 5 else "") + "; nothing changed",
                          hint="commit them (`vpatch update --continue` takes a commit made during the stop in, as "
                               "git rebase does) or set them aside (`git stash`), then vpatch update --continue")


def take_in_hand_edit(project: Project, state: UpdateState, series: Series, notes: list[str]) -> UpdateState:
    """The stopped patch's file edited by hand in patches/ (committed) and what the update tree holds make one
    resolution, or the update stops naming both; nothing either holds is thrown away (docs/update.md):
    - the header edited, the diff as it was: the header from the file, the diff from the tree;
    - the diff edited, the tree holding the same resolution: that one;
    - the diff edited, the tree holding no resolution (the conflict as the stop left it, nothing, or work with
      conflict markers left, which is set aside first): the file's diff goes into the tree in place of the conflict;
    - the diff edited, the tree holding a different resolution: stop, both left as they are."""
    if not state.pending:
        return state
    file = state.pending[0]
    recorded = load_stack(project.work)
    assert recorded is not None
    if file in {a.file for a in recorded.applied}:
        return state
    patches = project.config.patches
    path = project.path(f"{patches}/{file}")
    before = git.read_blobs(project.top, state.start, [path])[path]
    now_file = project.config.patches_dir / file
    if not now_file.is_file():
        raise VpatchError(f"{patches}/{file} was deleted during the stopped update; nothing changed",
                          hint=f"restore it (`git checkout {state.start[:12]} -- {path}`) and resolve in "
                               f"{project.tree}; or vpatch update --abort")
    if now_file.read_bytes() == before:
        return state
    patch = series.get(file.removesuffix(".patch"))
    digest = hashlib.sha256(patch.diff).hexdigest()
    if digest == state.edited:
        return state  # its diff is taken in already: the tree decides from there (the header is the file's)
    if before is not None and _diff_of(patch, before) == patch.diff:
        # a word in the header (a vendor bug named, a note) is no resolution: the tree decides the diff
        notes.append(f"took in the header of {patches}/{file} as edited by hand; its diff comes from the update tree")
        return state
    tree = project.tree
    made = _tree_resolution(project, state, recorded)
    if made is not None:
        if made != git.tree_with_patch(tree, recorded.tip, patch.diff):
            paths = [p for _, p in git.tree_changes(tree, recorded.tip, made)]
            raise ApplyError(
                f"{file} has two different resolutions: {patches}/{file} as edited by hand (committed during the "
                f"stop) and the update tree's ({', '.join(paths)}); nothing was discarded",
                hint=f"keep one, then vpatch update --continue. The tree's: put the diff of {patches}/{file} back "
                     f"as the update found it (`git show {state.start[:12]}:{path}`; edits of its header may stay) "
                     f"and commit. The file's: undo the work in the tree (`git -C {tree} reset --hard`)")
        notes.append(f"took in {patches}/{file} as edited by hand: the update tree holds the same resolution")
        state = replace(state, edited=digest, why=f"{state.why}; hand-edited in {patches}/")
        save_state(project, state)
        return state
    kept = keep_work(project, state, recorded)
    if kept is not None:
        notes.append(f"the update tree's work is set aside for the hand edit of {patches}/{file}: " + kept.words())
    if git.head(tree) != recorded.tip:
        git.reset_soft(tree, recorded.tip)
    git.discard_changes(tree)
    state = replace(state, edited=digest, why=f"{state.why}; hand-edited in {patches}/",
                    replayed=[f for f in state.replayed if f != file])  # what was set aside stays set aside
    save_state(project, state)
    applied = git.apply_to_worktree(tree, patch.diff)
    if applied.returncode != 0:
        applied = git.apply_to_worktree(tree, patch.diff, three_way=True)
        conflicts = git.unmerged_paths(tree)
        if applied.returncode != 0 or conflicts:
            if conflicts:
                resolution.label_conflicts(tree, conflicts, ours=ours_label(state.plan.to_ref), theirs=f"{file} (hand-edited)")
            raise ApplyError(f"{patches}/{file} as edited by hand does not apply on "
                             f"{state.plan.to_ref} either" + (f": conflicts in {', '.join(conflicts)}" if conflicts
                                                              else f"\n{applied.err.strip()}"),
                             hint=f"resolve them in {tree}, `git add` them, then vpatch update --continue (the "
                                  "edited file is taken in once; the tree decides from here)")
    notes.append(f"took in {patches}/{file} as edited by hand: it applies on {state.plan.to_ref}")
    return state


def _diff_of(patch: Patch, raw: bytes) -> bytes:
    """The diff of `raw`, an earlier version of `patch`'s file."""
    return Patch.parse(raw, number=patch.number, slug=patch.slug, path=patch.path).diff


def _tree_resolution(project: Project, state: UpdateState, recorded: Stack) -> str | None:
    """The tree that the person's resolution in the update tree makes; None where the update tree holds none:
    the conflict as the stop left it, nothing beyond the last committed patch, or work with conflict markers."""
    tree = project.tree
    if state.left and git.head(tree) == recorded.tip and tree_digest(project) == state.left:
        return None
    made = git.worktree_tree(tree)
    if made == git.tree_of(tree, recorded.tip) or resolution.has_markers(git.tree_diff(tree, recorded.tip, made)):
        return None
    return made


def refuse_unresolved(project: Project) -> None:
    unmerged = git.unmerged_paths(project.tree)
    if unmerged:
        raise ApplyError(f"{len(unmerged)} path(s) in the update tree still have conflicts: {', '.join(unmerged)}",
                         hint=f"resolve them in {project.tree}, `git add` them, then vpatch update --continue")


def commit_resolution(project: Project, state: UpdateState, series: Series) -> UpdateState:
    """The stopped patch as the person left it in the update tree, committed there as rewritten by hand for the
    target (a trailer and Last-Update say so), its plan row saying the same."""
    recorded = load_stack(project.work)
    assert recorded is not None
    if not state.pending or state.pending[0] in {a.file for a in recorded.applied}:
        return state
    tree, current = project.tree, state.pending[0]
    if git.head(tree) != recorded.tip:
        git.reset_soft(tree, recorded.tip)  # the user committed: keep the content, our message
    git.stage_all(tree)
    if git.index_matches(tree, "HEAD"):
        raise VpatchError(f"the resolution of {current} leaves no change on {state.plan.to_ref}",
                          hint="if upstream has the whole change, vpatch update --abort and check `vpatch status`; "
                               "otherwise make the change in the update tree and --continue")
    why = state.why or "it stopped there"
    # the trailer says what a reviewer needs (which release, what conflicted); the plan row says how it was resolved
    patch = resolution.rewritten_by_hand(series.get(current.removesuffix(".patch")), state.plan.to_ref,
                                         why.split(";")[0])
    commit_patch(tree, patch)
    record_applied(project, recorded, patch)
    rows = tuple(replace(p, decided_by=f"rewritten by hand for {state.plan.to_ref} ({why}); was: {p.decided_by}")
                 if p.file == current else p for p in state.plan.patches)
    # the resolution is committed in the update tree: a failure below leaves a state that resumes after it
    state = replace(state, plan=replace(state.plan, patches=rows), pending=state.pending[1:],
                    resolved=[*state.resolved, current])
    save_state(project, state)
    return state


def keep_work(project: Project, state: UpdateState | None, recorded: Stack | None) -> resolution.Kept | None:
    """What the person wrote in the update tree for the stopped patch, set aside before the tree goes."""
    if state is None or recorded is None or not state.pending or not project.tree.is_dir():
        return None
    if state.pending[0] in {a.file for a in recorded.applied}:
        return None
    if state.left and git.head(project.tree) == recorded.tip and tree_digest(project) == state.left:
        return None  # the tree holds the conflict as the stop left it: nobody wrote anything there
    return resolution.keep(project, state.pending[0], recorded.tip, state.plan.to_ref)


def tree_digest(project: Project) -> str:
    return hashlib.sha256(git.worktree_diff(project.tree)).hexdigest()


def ours_label(to_ref: str) -> str:
    return f"{to_ref} (upstream, with the patches before it)"


def record_applied(project: Project, recorded: Stack, patch: Patch) -> None:
    applied = (*recorded.applied, AppliedPatch(patch.filename, git.head(project.tree)))
    save_stack(project.work, replace(recorded, applied=applied))
