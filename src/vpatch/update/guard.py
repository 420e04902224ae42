"""What an update must know before it moves: that the target is newer (release branches included); the carried
patches applied in memory as the update tree will hold them (disposition.py checks them there)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch import git
from vpatch.base import VpatchError
from vpatch.update.plan import Action, PatchPlan, Revalidation, UpdatePlan
from vpatch.upstream import direction_between

if TYPE_CHECKING:
    from vpatch.config import Config
    from vpatch.series import Patch

class Refused(VpatchError):
    """A move some disposition refuses, carrying the plan of every disposition (for the dry run's table)."""

    def __init__(self, error: VpatchError, plan: UpdatePlan) -> None:
        super().__init__(error.message, hint=error.hint, exit_code=error.exit_code)
        self.plan = plan


def refuse_downgrade(repo: Path, config: Config, current: str, to: str, target: str) -> None:
    """Only a move to a newer upstream goes without --allow-downgrade (direction_between says why)."""
    way = direction_between(repo, current=current, current_ref=config.pin.ref, target=target, target_ref=to,
                            branch=config.upstream.branch)
    if not way.forward:
        raise VpatchError(f"{to} is not newer than the pin {config.pin.ref}: {way.reason}",
                          hint="pass --allow-downgrade to move the pin backwards (or sideways) anyway")


@dataclass(frozen=True)
class Applied:
    """One kept patch applied in memory by the dry run, as the real run applies it in its update tree."""

    row: PatchPlan
    parent: str  # the commit it applies on (the new pin plus the kept patches before it)
    commit: str  # the commit it gives (both `git.scratch_commit`s: no ref names them)
    tree: str


def applied_in_memory(repo: Path, plan: UpdatePlan, patches: dict[str, Patch]) -> list[Applied]:
    """The new pin plus each carried patch (`patches`: file -> the patch as the update applies it: re-targeted,
    narrowed), by plain applies: from the first patch that only merges 3-way (or stops) on, the real run's update
    tree is needed, and what comes after is left to it."""
    out: list[Applied] = []
    parent = plan.to_commit
    for row in plan.patches:
        if row.action in (Action.DROP, Action.REFUSE):
            continue
        tree = git.tree_with_patch(repo, parent, patches[row.file].raw) if row.action is not Action.STOP else None
        if tree is None:
            break
        commit = git.scratch_commit(repo, tree, parent)
        out.append(Applied(row, parent, commit, tree))
        parent = commit
    return out


def unvalidated(failed: list[Revalidation], to_ref: str) -> VpatchError:
    """The error of an update whose kept patches' probes do not validate on the new pin (real run and dry run)."""
    return VpatchError(
        f"probe of {failed[0].file} no longer validates on {to_ref}: {failed[0].detail}"
        + "".join(f"\nprobe of {p.file}: {p.detail}" for p in failed[1:]),
        hint="the probe must fail without its patch and pass with it; fix the probe (or the patch), commit, "
             "and run the update again; the project is unchanged")
