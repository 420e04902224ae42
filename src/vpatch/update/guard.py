"""What an update must prove before it moves: that the target is newer (release branches included), and that
every probe a drop leans on tells the bug from the fix on the old pin."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch import git
from vpatch.base import VpatchError
from vpatch.update.plan import FileAction, PatchPlan, Revalidation, UpdatePlan
from vpatch.upstream import direction_between
from vpatch.verdict import Action, vetoed

if TYPE_CHECKING:
    from vpatch.config import Config
    from vpatch.series import Patch, Series

class Refused(VpatchError):
    """A dry run refused as the real run would, carrying the judging it refused after (for the table)."""

    def __init__(self, error: VpatchError, report: object) -> None:
        super().__init__(error.message, hint=error.hint, exit_code=error.exit_code)
        self.report = report


# (repo, config, patch, base, patched) -> the probe checked on base (must fail) and patched (must pass).
Check = Callable[[Path, "Config", "Patch", str, str], Revalidation]


def refuse_downgrade(repo: Path, config: Config, current: str, to: str, target: str) -> None:
    """Only a move to a newer upstream goes without --allow-downgrade (direction_between says why)."""
    way = direction_between(repo, current=current, current_ref=config.pin.ref, target=target, target_ref=to,
                            branch=config.upstream.branch)
    if not way.forward:
        raise VpatchError(f"{to} is not newer than the pin {config.pin.ref}: {way.reason}",
                          hint="pass --allow-downgrade to move the pin backwards (or sideways) anyway")


def refuse_unproven_drops(repo: Path, config: Config, series: Series, plan: UpdatePlan, check: Check) -> None:
    """A dropped patch's probe is re-validated on the old pin (fails there, passes with the patch): a probe
    that cannot tell the bug from the fix is no reason to drop anything."""
    by_file = {p.filename: p for p in series}
    for row in plan.patches:
        patch = by_file[row.file]
        if row.action is not FileAction.DROP or patch.probe_path is None:
            continue
        patched = git.tree_with_patch(repo, plan.from_commit, patch.raw)
        if patched is None:
            raise VpatchError(f"not dropping {row.file}: it does not apply on the pin {plan.from_ref}, so its probe"
                              " cannot be re-validated", hint=f"vpatch apply --ref {plan.from_ref} shows the conflict")
        try:
            result = check(repo, config, patch, plan.from_commit, patched)
        except VpatchError as exc:
            result = Revalidation(row.file, patch.trailer("Probe"), False, exc.message)
        if not result.ok:
            # the veto: the drop's case is an invalid probe after all (Case.INVALID_PROBE: Action.REFUSE)
            raise vetoed(row.file, dropping=True, pin_ref=plan.from_ref, detail=result.detail)


def refuse_missing_live_checks(config: Config, series: Series, plan: UpdatePlan) -> None:
    """A dropped patch's Live-Check: goes into RETIRED.md, and the next deploy runs it against the new server
    to show the drop was right: a drop whose check names no file would only fail there, after the pin moved."""
    by_file = {p.filename: p for p in series}
    for row in plan.patches:
        patch = by_file[row.file]
        if row.action is not FileAction.DROP or patch.live_check is None:
            continue
        path = patch.live_check_path(config.root)
        if path is not None and not path.is_file():
            raise VpatchError(
                f"not dropping {row.file}: its Live-Check: {patch.live_check} names no file in the project",
                hint="a deploy runs that check against the new server to show the drop is right: add the file "
                     "(docs/live-checks.md) or remove the trailer, then update again")


def refuse_invalid_probes(plan: UpdatePlan) -> None:
    """The last word on a patch whose probe status found INVALID (Case.INVALID_PROBE, Action.REFUSE): its row went
    on as its text said so that the checks above refuse it with what the probe does, and if none of them did
    (its probe validates on the new pin, not on the pin) the move is still refused: the decision stands."""
    for row in plan.patches:
        if row.case.action is Action.REFUSE:
            raise vetoed(row.file, dropping=row.action is FileAction.DROP, pin_ref=plan.from_ref,
                         detail=row.decided_by)


@dataclass(frozen=True)
class Applied:
    """One kept patch applied in memory by the dry run, as the real run applies it in its update tree."""

    row: PatchPlan
    parent: str  # the commit it applies on (the new pin plus the kept patches before it)
    commit: str  # the commit it gives (both `git.scratch_commit`s: no ref names them)
    tree: str


def applied_in_memory(repo: Path, plan: UpdatePlan, patches: dict[str, Patch]) -> list[Applied]:
    """The new pin plus each kept patch (`patches`: file -> the patch as the update applies it: re-targeted,
    narrowed), by plain applies: from the first patch that only merges 3-way on, the real run's update tree is
    needed, and what comes after is left to it."""
    out: list[Applied] = []
    parent = plan.to_commit
    for row in plan.patches:
        if row.action is FileAction.DROP:
            continue
        tree = git.tree_with_patch(repo, parent, patches[row.file].raw)
        if tree is None:
            break
        commit = git.scratch_commit(repo, tree, parent)
        out.append(Applied(row, parent, commit, tree))
        parent = commit
    return out


def refuse_unvalidated_kept(repo: Path, config: Config, plan: UpdatePlan, check: Check, applied: list[Applied],
                            patches: dict[str, Patch]) -> list[Revalidation]:
    """The dry run's copy of the real run's last check: each kept patch's probe on the new pin (must fail) and on
    the new pin plus the kept patches up to it (must pass, `applied`), raising the real run's error when one does
    not. `patches`: file -> the patch as the update validates it (its probe as the update writes it)."""
    checked = [check(repo, config, patches[a.row.file], plan.to_commit, a.tree) for a in applied  # raises as the run
               if a.row.action is not FileAction.STOP and patches[a.row.file].probe_path is not None]
    failed = [c for c in checked if not c.ok]
    if failed:
        raise unvalidated(failed, plan.to_ref)
    return checked


def unvalidated(failed: list[Revalidation], to_ref: str) -> VpatchError:
    """The error of an update whose kept patches' probes do not validate on the new pin (real run and dry run)."""
    return VpatchError(
        f"probe of {failed[0].file} no longer validates on {to_ref}: {failed[0].detail}"
        + "".join(f"\nprobe of {p.file}: {p.detail}" for p in failed[1:]),
        hint="the probe must fail without its patch and pass with it; fix the probe (or the patch), commit, "
             "and run the update again; the project is unchanged")
