"""Move the pin: drop the patches upstream now has (with evidence), refresh the rest, commit once, or stop on a conflict.

The project is touched only at the very end. Until then the work happens in `.git/vpatch-update/` of the
project's repository: a work tree of the upstream mirror at the new pin holding the kept patches as
commits. A stop on a conflict leaves that folder with `state.json` (like git's rebase state) for
`--continue` / `--abort`. The project commit is built as objects first; moving the branch ref is the one
commit point, journaled in `commit.json` so that a kill right after it can be finished or undone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from vpatch import git, stack
from vpatch.errors import ApplyError, ExitCode, VpatchError
from vpatch.fs import atomic_write
from vpatch.retired import RETIRED_FILE, RetiredPatch, with_entries
from vpatch.series import Patch, Series

if TYPE_CHECKING:
    from vpatch.config import Config

WORK_DIR = "vpatch-update"
STATE_FILE = "state.json"
JOURNAL_FILE = "commit.json"
KILL_ENV = "VPATCH_TEST_KILL_AT"
# Every point where the interrupt tests kill the process, in the order an update reaches them.
STEPS = ("resolved", "judged", "applied", "validated", "exported", "prepared", "committed")


class Action(str, Enum):
    DROP = "drop"  # landed upstream: the file goes, RETIRED.md records why
    REFRESH = "refresh"  # needed: re-applied on the new pin, the file re-exported (and it changed)
    KEEP = "keep"  # needed: re-applied on the new pin, the file is byte-identical
    STOP = "stop"  # partial or conflict: a person must resolve it in the update tree


class Outcome(str, Enum):
    PLANNED = "planned"  # --dry-run: nothing changed
    COMMITTED = "committed"
    STAGED = "staged"  # --no-commit: the changes are in the index and work tree
    STOPPED = "stopped"  # on a conflict; state kept for --continue / --abort
    ABORTED = "aborted"


@dataclass(frozen=True)
class PatchPlan:
    file: str
    subject: str
    state: str  # the verdict on the new pin: landed / needed / partial / conflict
    action: Action
    decided_by: str  # the evidence that set the state
    evidence: tuple[str, ...]  # every fact, strongest first
    landed_in: str | None = None  # Applied-Upstream: "v0.30.0 (commit 1a2b3c4d5e6f, release v0.30.0)"
    upstream_pr: str | None = None


@dataclass(frozen=True)
class Plan:
    from_ref: str
    from_commit: str
    to_ref: str
    to_commit: str
    patches: tuple[PatchPlan, ...]
    report: object = field(default=None, compare=False, repr=False)  # status.Status of the judging, for display

    def with_action(self, file: str, action: Action) -> Plan:
        return replace(self, patches=tuple(replace(p, action=action) if p.file == file else p for p in self.patches))

    def files(self, *actions: Action) -> list[str]:
        return [p.file for p in self.patches if p.action in actions]

    @property
    def all_landed(self) -> bool:
        return all(p.action is Action.DROP for p in self.patches)

    def to_dict(self) -> dict[str, object]:
        return {"from_ref": self.from_ref, "from_commit": self.from_commit, "to_ref": self.to_ref,
                "to_commit": self.to_commit,
                "patches": [{**asdict(p), "action": p.action.value} for p in self.patches]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        rows = data["patches"]
        assert isinstance(rows, list)
        patches = tuple(PatchPlan(**{**r, "action": Action(r["action"]), "evidence": tuple(r["evidence"])}) for r in rows)
        return cls(str(data["from_ref"]), str(data["from_commit"]), str(data["to_ref"]), str(data["to_commit"]), patches)


@dataclass(frozen=True)
class ProbeCheck:
    """A remaining patch's probe re-validated on the new pin: fails without the patch, passes with it."""

    file: str
    probe: str | None  # None: the patch has no probe
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class Stop:
    file: str
    state: str
    worktree: Path
    conflicts: tuple[str, ...]  # unmerged paths left by the 3-way apply
    reason: str


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    plan: Plan
    commit: str | None = None  # the project commit (COMMITTED)
    message: str = ""  # the commit message (COMMITTED / STAGED)
    probes: tuple[ProbeCheck, ...] = ()
    stop: Stop | None = None

    @property
    def all_landed(self) -> bool:
        return self.plan.all_landed

    def to_json(self) -> dict[str, object]:
        """The result for CI: outcome, pin move, every patch's action and evidence, probes, the commit."""
        plan = self.plan.to_dict()
        return {
            "outcome": self.outcome.value,
            "pin": {"from": {"ref": self.plan.from_ref, "commit": self.plan.from_commit},
                    "to": {"ref": self.plan.to_ref, "commit": self.plan.to_commit}},
            "patches": plan["patches"],
            "dropped": self.plan.files(Action.DROP),
            "refreshed": self.plan.files(Action.REFRESH),
            "kept": self.plan.files(Action.KEEP),
            "probes": [asdict(p) for p in self.probes],
            "commit": self.commit,
            "message": self.message or None,
            "stop": None if self.stop is None else {**asdict(self.stop), "worktree": str(self.stop.worktree)},
            "no_local_patch_remains": self.all_landed and self.outcome is not Outcome.STOPPED,
        }


# (repo, config, series, pin commit, target ref, target commit) -> one PatchPlan per patch, in series order,
# and the status report they came from (shown by --dry-run; None when there is none).
Judge = Callable[[Path, "Config", Series, str, str, str], "tuple[list[PatchPlan], object | None]"]
# (repo, config, patch, base commit, patched commit) -> the probe re-validated on the new pin.
Validator = Callable[[Path, "Config", Patch, str, str], ProbeCheck]


@dataclass(frozen=True)
class _Project:
    """The project's place in its git repository."""

    config: Config
    top: Path  # the repository's work tree root
    git_dir: Path
    rel: str  # the project folder relative to `top` ("" when it is the root)

    @property
    def work(self) -> Path:
        return self.git_dir / WORK_DIR

    @property
    def tree(self) -> Path:
        return self.work / "tree"

    def path(self, name: str) -> str:
        return f"{self.rel}/{name}" if self.rel else name

    @classmethod
    def open(cls, config: Config) -> _Project:
        top = git.toplevel(config.root)
        if top is None:
            raise VpatchError(f"{config.root} is not in a git repository",
                              hint="vpatch update commits its change; run `git init` and commit the project first")
        rel = config.root.resolve().relative_to(top.resolve()).as_posix()
        return cls(config, top, git.git_dir(top), "" if rel == "." else rel)


# --- the command's entry points ------------------------------------------------------------------


def update(
    config: Config, to: str, *, dry_run: bool = False, no_commit: bool = False, allow_downgrade: bool = False,
    judge: Judge | None = None, validator: Validator | None = None,
) -> Result:
    """Move the pin to `to`; see the module docstring. Raises VpatchError and leaves the project as it was."""
    from vpatch import upstream

    project = _Project.open(config)
    _refuse_in_progress(project)
    _refuse_dirty(project)
    repo = upstream.open_upstream(config)
    target = upstream.resolve(repo, to)
    current = config.pin.commit or upstream.resolve(repo, config.pin.ref, what="pin")
    if not allow_downgrade and target != current and not git.is_ancestor(repo, current, target):
        raise VpatchError(f"{to} ({target[:12]}) does not descend from the pin {config.pin.ref} ({current[:12]})",
                          hint="pass --allow-downgrade to move the pin backwards (or sideways) anyway")
    series = Series.load(config.patches_dir)
    _checkpoint("resolved")
    rows, report = (judge or judge_with_status)(repo, config, series, current, to, target)
    plan = Plan(config.pin.ref, current, to, target, tuple(rows), report)
    _checkpoint("judged")
    if dry_run:
        return Result(Outcome.PLANNED, plan)
    _clear_stale(project, repo)
    try:
        state = _State(plan=plan, head=git.head(project.top), head_ref=git.head_ref(project.top), repo=str(repo),
                       no_commit=no_commit, pending=plan.files(Action.KEEP, Action.STOP))
        return _run(project, series, state, validator)
    except BaseException:
        _discard(project, repo)
        raise


def resume(config: Config, *, validator: Validator | None = None) -> Result:
    """`--continue`: commit the resolved patch in the update tree, apply the rest, finish."""
    project = _Project.open(config)
    journal = _read_json(project.work / JOURNAL_FILE)
    if journal is not None:
        return _finish_commit(project, journal)
    state = _load_state(project)
    repo = Path(state.repo)
    if git.head(project.top) != state.head:
        raise VpatchError("the project's HEAD moved since the update stopped",
                          hint="vpatch update --abort, then start the update again")
    _refuse_dirty(project)
    series = Series.load(config.patches_dir)
    tree = project.tree
    unmerged = git.unmerged_paths(tree)
    if unmerged:
        raise ApplyError(f"{len(unmerged)} path(s) in the update tree still have conflicts: {', '.join(unmerged)}",
                         hint=f"resolve them in {tree}, `git add` them, then vpatch update --continue")
    recorded = stack.load_stack(project.work)
    assert recorded is not None
    if state.pending and state.pending[0] not in {a.file for a in recorded.applied}:
        current = state.pending[0]
        patch = series.get(current.removesuffix(".patch"))
        if git.head(tree) != recorded.tip:
            git.run(tree, ["reset", "--soft", "--quiet", recorded.tip])  # the user committed: keep the content, our message
        git.run(tree, ["add", "-A"])
        if not git.run(tree, ["diff", "--cached", "--quiet"], check=False).returncode:
            raise VpatchError(f"the resolution of {current} leaves no change on {state.plan.to_ref}",
                              hint="if upstream has the whole change, vpatch update --abort and check `vpatch status`; "
                                   "otherwise make the change in the update tree and --continue")
        stack.commit_patch(tree, patch)
        _record_stack(project, recorded, patch)
        # the resolution is committed in the update tree: a failure below leaves a state that resumes after it
        state = replace(state, pending=state.pending[1:], resolved=[*state.resolved, current])
        _save_state(project, state)
    return _run(project, series, state, validator)


def abort(config: Config) -> Result:
    """`--abort`: throw the update tree and state away; undo the project commit if a kill interrupted it."""
    project = _Project.open(config)
    journal = _read_json(project.work / JOURNAL_FILE)
    state_data = _read_json(project.work / STATE_FILE)
    if journal is None and state_data is None:
        raise VpatchError("no update in progress", hint="vpatch update --to REF starts one")
    plan: Plan | None = None
    if journal is not None:
        ref, old, new = journal["ref"], journal["old"], journal["new"]
        if git.resolve_commit(project.top, ref) == new:
            git.update_refs(project.top, [git.RefUpdate(ref, old, new)])
            if git.index_tree(project.top) == git.tree_of(project.top, new):
                git.switch_tree(project.top, new, old)  # killed after the check-out began: put the files back
        plan = Plan.from_dict(journal["plan"])
    if state_data is not None:
        plan = Plan.from_dict(state_data["plan"])
    repo = Path((journal or state_data or {})["repo"])
    _discard(project, repo)
    assert plan is not None
    return Result(Outcome.ABORTED, plan)


# --- judging: the verdict of each patch on the new pin -------------------------------------------


def judge_with_status(
    repo: Path, config: Config, series: Series, current: str, to: str, target: str,
) -> tuple[list[PatchPlan], object | None]:
    """Verdicts from `vpatch status` (issue 6): the pin and the target as columns, the target decides."""
    from vpatch import status

    pin = status.Target(config.pin.ref, current)
    targets = [pin] if target == current else [pin, status.Target(to, target)]
    report = status.compute(repo, series.patches, pin=pin, targets=targets, history=config.upstream.source == "git",
                            branch=config.upstream.branch, probe=_probe_fn(repo, config))
    rows = []
    for patch, row in zip(series.patches, report.patches):
        verdict = row.results[-1]
        state = verdict.state.value
        action = {"landed": Action.DROP, "needed": Action.KEEP}.get(state, Action.STOP)
        decided = verdict.decided_by
        landed_in = None
        if action is Action.DROP:
            landed_in = _landing_text(row.landed_in, to, target)
        rows.append(PatchPlan(patch.filename, patch.subject, state, action, str(decided) if decided else "",
                              tuple(str(e) for e in verdict.evidence), landed_in,
                              patch.trailer("Upstream-PR")))
    return rows, report


def _landing_text(landing: object, to: str, target: str) -> str:
    if landing is None:
        return f"{to} (commit {target[:12]})"
    ref, commit, release = getattr(landing, "ref"), getattr(landing, "commit"), getattr(landing, "release")
    where = "in no release yet" if release is None else f"release {release}"
    first = "first commit" if getattr(landing, "bisected", False) else "commit"
    return f"{ref} ({first} {commit[:12]}, {where})"


def _probe_fn(repo: Path, config: Config):  # type: ignore[no-untyped-def]
    """The probe runner `vpatch status` uses (probe results cached by probe content and tree)."""
    from vpatch import status

    factory = getattr(status, "probe_fn", None)
    return factory(repo, config) if factory is not None else None


# --- the work: apply on the new pin, validate, export, commit ------------------------------------


@dataclass(frozen=True)
class _State:
    plan: Plan
    head: str  # the project's HEAD when the update started
    head_ref: str
    repo: str  # the upstream repository
    no_commit: bool
    pending: list[str]  # kept patches not yet committed in the update tree (the first one stopped)
    resolved: list[str] = field(default_factory=list)  # patches a person resolved (--continue)

    def to_json(self) -> str:
        data = {**asdict(self), "plan": self.plan.to_dict()}
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> _State:
        data = json.loads(text)
        return cls(**{**data, "plan": Plan.from_dict(data["plan"])})


def _run(project: _Project, series: Series, state: _State, validator: Validator | None) -> Result:
    """Apply the pending patches in the update tree, then finish; or stop on the first that needs a person."""
    config, repo, plan = project.config, Path(state.repo), state.plan
    by_file = {p.filename: p for p in series}
    kept = [by_file[f] for f in plan.files(Action.KEEP, Action.REFRESH, Action.STOP)]
    if not project.tree.exists():
        done = _start_tree(project, repo, plan, kept, state.pending)
        state = replace(state, pending=[f for f in state.pending if f not in done])
    for i, file in enumerate(list(state.pending)):
        row = next(p for p in plan.patches if p.file == file)
        stopped = _apply_next(project, by_file[file], row, plan.to_ref)
        if stopped is not None:
            state = replace(state, pending=state.pending[i:])
            _save_state(project, state)
            return Result(Outcome.STOPPED, plan, stop=stopped)
    state = replace(state, pending=[])
    _checkpoint("applied")
    applied = stack.load_stack(project.work)
    assert applied is not None
    probes = tuple(_validate(repo, config, by_file[a.file], applied.base, a.commit, validator) for a in applied.applied)
    failed = [p for p in probes if not p.ok]
    if failed:
        raise VpatchError(
            f"probe of {failed[0].file} no longer validates on {plan.to_ref}: {failed[0].detail}"
            + "".join(f"\nprobe of {p.file}: {p.detail}" for p in failed[1:]),
            hint="the probe must fail without its patch and pass with it; fix the probe (or the patch), commit, "
                 "and run the update again; the project is unchanged")
    _checkpoint("validated")
    exported = stack.export_series(Series(series.directory, tuple(kept), series.retired), project.work, dry_run=True)
    plan = _mark_refreshed(plan, exported)
    _checkpoint("exported")
    return _commit(project, series, state, plan, exported, probes)


def _start_tree(project: _Project, repo: Path, plan: Plan, kept: list[Patch], pending: list[str]) -> set[str]:
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
        stack.apply_series(repo, Series(project.config.patches_dir, tuple(clean_prefix)), ref=plan.to_ref,
                           base=plan.to_commit, out=project.tree, state_dir=project.work, keep=True)
    except ApplyError:
        pass  # _apply_next goes on from the failing patch, 3-way
    applied = stack.load_stack(project.work)
    assert applied is not None
    return {a.file for a in applied.applied}


def _apply_next(project: _Project, patch: Patch, row: PatchPlan, to_ref: str) -> Stop | None:
    """Commit one patch in the update tree: plainly, else by a clean 3-way merge; else leave the conflict and stop."""
    tree = project.tree
    recorded = stack.load_stack(project.work)
    assert recorded is not None
    if row.action is not Action.STOP and git.apply_to_worktree(tree, patch.diff).returncode == 0:
        stack.commit_patch(tree, patch)
        _record_stack(project, recorded, patch)
        return None
    merged = git.apply_to_worktree(tree, patch.diff, three_way=True)
    conflicts = tuple(git.unmerged_paths(tree))
    if merged.returncode == 0 and not conflicts and row.action is not Action.STOP:
        stack.commit_patch(tree, patch)
        _record_stack(project, recorded, patch)
        return None
    if row.action is Action.STOP:
        reason = f"{row.file} is {row.state} on {to_ref}: {row.decided_by}"
    else:
        reason = f"{row.file} does not apply on {to_ref}, not even with a clean 3-way merge"
    if merged.returncode != 0 and not conflicts:
        reason += "\n" + merged.err.strip()
    return Stop(row.file, row.state, tree, conflicts, reason)


def _record_stack(project: _Project, recorded: stack.Stack, patch: Patch) -> None:
    applied = (*recorded.applied, stack.AppliedPatch(patch.filename, git.head(project.tree)))
    atomic_write(project.work / stack.STATE_FILE, replace(recorded, applied=applied).to_json().encode())


def _mark_refreshed(plan: Plan, exported: stack.ExportResult) -> Plan:
    for file in exported.changed:
        plan = plan.with_action(file, Action.REFRESH)
    for file in exported.unchanged:
        plan = plan.with_action(file, Action.KEEP)
    return plan


def _validate(repo: Path, config: Config, patch: Patch, base: str, patched: str, validator: Validator | None) -> ProbeCheck:
    if patch.probe_path is None:
        return ProbeCheck(patch.filename, None, True, "no probe")
    return (validator or validate_with_probes)(repo, config, patch, base, patched)


def validate_with_probes(repo: Path, config: Config, patch: Patch, base: str, patched: str) -> ProbeCheck:
    """The probes module's `validate_probe` (issue 3): the probe must fail on `base` and pass on `patched`.

    Expected interface: validate_probe(repo, config, patch, base=<commit>, patched=<commit>) returning an
    object with `ok` (bool) and `detail` (str), or raising VpatchError. Until that module exists the probe
    is reported as not re-validated (in the result and the commit message) rather than blocking the update.
    """
    import importlib

    try:
        probes = importlib.import_module("vpatch.probes")
        validate = getattr(probes, "validate_probe")
    except (ImportError, AttributeError):
        return ProbeCheck(patch.filename, patch.trailer("Probe"), True, "NOT re-validated: this vpatch has no probe runner")
    outcome = validate(repo, config, patch, base=base, patched=patched)
    return ProbeCheck(patch.filename, patch.trailer("Probe"), bool(getattr(outcome, "ok", outcome)),
                      str(getattr(outcome, "detail", "")))


def _commit(project: _Project, series: Series, state: _State, plan: Plan, exported: stack.ExportResult,
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
    _checkpoint("prepared")
    if state.no_commit:
        git.switch_tree(top, old, tree)
        _discard(project, Path(state.repo))
        return Result(Outcome.STAGED, plan, message=message, probes=probes)
    new = git.commit_tree(top, tree, [old], message)
    journal: dict[str, Any] = {"ref": state.head_ref, "old": old, "new": new, "repo": state.repo, "plan": plan.to_dict(),
               "message": message}
    atomic_write(project.work / JOURNAL_FILE, (json.dumps(journal, indent=2) + "\n").encode())
    git.update_refs(top, [git.RefUpdate(state.head_ref, new, old)])
    _checkpoint("committed")
    return replace(_finish_commit(project, journal), probes=probes)


def _finish_commit(project: _Project, journal: dict[str, Any]) -> Result:
    """After the ref moved: bring the index and files to the new commit, then forget the update."""
    old, new = str(journal["old"]), str(journal["new"])
    git.switch_tree(project.top, old, new)
    (project.work / JOURNAL_FILE).unlink()
    _discard(project, Path(str(journal["repo"])))
    plan = Plan.from_dict(journal["plan"])
    return Result(Outcome.COMMITTED, plan, commit=new, message=str(journal["message"]))


def _retired_entries(project: _Project, series: Series, plan: Plan, head: str) -> list[RetiredPatch]:
    entries = []
    for row in plan.patches:
        if row.action is not Action.DROP:
            continue
        patch = series.get(row.file.removesuffix(".patch"))
        entries.append(RetiredPatch(
            patch.number, patch.slug, patch.subject, row.landed_in or plan.to_ref,
            (f"{row.decided_by} (on {plan.to_ref})",) + tuple(e for e in row.evidence if e != row.decided_by),
            f"update {plan.from_ref} -> {plan.to_ref}",
            f"{head[:12]}:{project.path(f'{project.config.patches}/{row.file}')}", row.upstream_pr,
        ))
    return entries


def commit_message(plan: Plan, probes: Sequence[ProbeCheck] = ()) -> str:
    """One message naming every patch: dropped with its evidence and landing point, refreshed, kept."""
    dropped, refreshed, kept = plan.files(Action.DROP), plan.files(Action.REFRESH), plan.files(Action.KEEP)
    subject = f"Update upstream pin {plan.from_ref} -> {plan.to_ref}"
    if dropped:
        subject += f": drop {', '.join(f[:4] for f in dropped)}"
    lines = [subject, "", f"Pin: {plan.from_ref} ({plan.from_commit[:12]}) -> {plan.to_ref} ({plan.to_commit[:12]})"]
    rows = {p.file: p for p in plan.patches}
    if dropped:
        lines += ["", f"Dropped, landed upstream (recorded in {RETIRED_FILE}):"]
        for f in dropped:
            r = rows[f]
            lines += [f"- {f}: {r.subject}", f"  Applied-Upstream: {r.landed_in}", f"  Evidence: {r.decided_by}"]
            lines += [f"  Also: {e}" for e in r.evidence if e != r.decided_by]
    if refreshed:
        lines += ["", f"Refreshed, re-exported against {plan.to_ref}:"]
        lines += [f"- {f}: {rows[f].state}: {rows[f].decided_by}" for f in refreshed]
    if kept:
        lines += ["", "Kept, unchanged:"]
        lines += [f"- {f}: {rows[f].state}: {rows[f].decided_by}" for f in kept]
    checked = [p for p in probes if p.probe]
    if checked:
        lines += ["", f"Probes re-validated on {plan.to_ref} (fail without the patch, pass with it):"]
        lines += [f"- {p.file}: {p.probe}" + (f" ({p.detail})" if p.detail else "") for p in checked]
    if plan.all_landed:
        lines += ["", f"No local patch remains: the official vLLM {plan.to_ref} image now suffices."]
    return "\n".join(lines) + "\n"


# --- state, staleness and the interrupt hook -----------------------------------------------------


def _refuse_dirty(project: _Project) -> None:
    dirty = git.dirty_paths(project.top, [project.path(project.config.patches), project.path("vpatch.yaml")])
    if dirty:
        shown = ", ".join(dirty[:5]) + (" ..." if len(dirty) > 5 else "")
        raise VpatchError(f"uncommitted changes in the series or the pin: {shown}",
                          hint="commit or discard them first: vpatch update makes one commit of its own")


def _refuse_in_progress(project: _Project) -> None:
    if (project.work / JOURNAL_FILE).exists():
        raise VpatchError("an update was interrupted while committing",
                          hint="vpatch update --continue finishes it; vpatch update --abort undoes it")
    if (project.work / STATE_FILE).exists():
        state = _load_state(project)
        raise VpatchError(f"an update to {state.plan.to_ref} is in progress, stopped at {state.pending[0]}",
                          hint=f"resolve it in {project.tree}, then vpatch update --continue; or vpatch update --abort")


def _clear_stale(project: _Project, repo: Path) -> None:
    """Leftovers of a killed run (no state file): nothing anyone can continue, so remove them."""
    if project.work.exists():
        _discard(project, repo)


def _discard(project: _Project, repo: Path) -> None:
    # Deleting the files first and pruning the registration after is several times faster than
    # `git worktree remove` on vLLM's tree, and equally final.
    shutil.rmtree(project.work, ignore_errors=True)
    git.run(repo, ["worktree", "prune"], check=False)


def _save_state(project: _Project, state: _State) -> None:
    atomic_write(project.work / STATE_FILE, state.to_json().encode())


def _load_state(project: _Project) -> _State:
    path = project.work / STATE_FILE
    if not path.is_file():
        raise VpatchError("no update in progress", hint="vpatch update --to REF starts one")
    return _State.from_json(path.read_text())


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _checkpoint(step: str) -> None:
    """Test hook: VPATCH_TEST_KILL_AT=<step> kills the process here, as a power cut or `kill -9` would."""
    if os.environ.get(KILL_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["Action", "Outcome", "Plan", "PatchPlan", "ProbeCheck", "Result", "Stop", "STEPS", "ExitCode",
           "abort", "commit_message", "judge_with_status", "resume", "update"]
