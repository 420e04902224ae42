"""How `vpatch update` shows its plan and its result: the verdict table of a dry run, then one line per step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vpatch.report import status as report
from vpatch.report.disposition import disposition_json, reason
from vpatch.status import Status
from vpatch.update import Action, Dispositions, UpdateOutcome

if TYPE_CHECKING:
    from rich.console import RenderableType

    from vpatch.update import Reach, Result


def plan_table(result: Result) -> RenderableType | None:
    """The status table a dry run's plan was made from; None for every other outcome."""
    if result.outcome is not UpdateOutcome.PLANNED or result.plan.report is None:
        return None

    assert isinstance(result.plan.report, Status)
    # the same cells as `status --against` the target: the verdicts, and the dispositions the plan holds
    return report.status_table(result.plan.report, Dispositions({result.plan.to_ref: result.plan.patches}))


def update_json(result: Result) -> dict[str, object]:
    """`update --json`: the result, each patch with its `disposition` object as `status --json` has it."""
    out = result.to_json()
    rows = {p.file: p for p in result.plan.patches}
    patches = out["patches"]
    assert isinstance(patches, list)
    out["patches"] = [{**entry, "disposition": disposition_json(rows[entry["file"]])} for entry in patches]
    return out


def update_lines(result: Result) -> list[str]:
    """The plan or the result, one line per patch and step (after plan_table's table, where there is one)."""
    plan = result.plan
    lines = []
    if result.outcome is UpdateOutcome.ABORTED:
        return [f"aborted the update to {plan.to_ref}; the project is as it was (pin {plan.from_ref})",
                *result.notes]
    if result.outcome is UpdateOutcome.UP_TO_DATE:
        return [f"already there: the pin {plan.from_ref} is {plan.to_ref} ({plan.to_commit[:12]}); nothing changed"]
    if result.outcome is UpdateOutcome.BLOCKED:
        return [f"the pin {plan.from_ref} stays: the first step toward the target needs a person; nothing changed"]
    head = "plan" if result.outcome is UpdateOutcome.PLANNED else "update"
    if result.outcome is not UpdateOutcome.STOPPED:
        lines += list(result.notes)  # what --continue took in from a person's work at the stop
    lines.append(f"{head}: pin {plan.from_ref} ({plan.from_commit[:12]}) -> {plan.to_ref} ({plan.to_commit[:12]})")
    for row in plan.patches:
        verb = row.verb(planned=result.outcome is UpdateOutcome.PLANNED)  # the disposition's words
        lines.append(f"  {verb:<14} {row.file}  [{row.state}] {row.decided_by}")
        lines += [f"  {'':<14} moved: {move}" for move in row.moves if f"moved: {move}" != row.decided_by]
        if row.move_proof:
            lines.append(f"  {'':<14} proof: {row.move_proof}")
        lines += [f"  {'':<14} {line}" for line in row.probe_moves]
        if row.action is Action.DROP:
            lines.append(f"  {'':<14} Applied-Upstream: {row.landed_in}")
        if row.action is Action.REFUSE:
            lines.append(f"  {'':<14} refused: {reason(row)}")
        if row.narrowing is not None:
            lines.append(f"  {'':<14} {reason(row)}")
            lines.append(f"  {'':<14} proof: {row.narrowing.proof}")
            if row.narrowing.probe != "no probe":
                lines.append(f"  {'':<14} probe: {row.narrowing.probe}")
    for check in result.probes:
        if check.probe:
            lines.append(f"  probe {check.probe} re-validated on {plan.to_ref}" + (f": {check.detail}" if check.detail else ""))
    if result.outcome is UpdateOutcome.COMMITTED:
        lines.append(f"committed {(result.commit or '')[:12]}: {result.message.splitlines()[0]}")
    elif result.outcome is UpdateOutcome.STAGED:
        lines.append("staged in the project, not committed; the message vpatch would use:")
        lines += ["    " + line for line in result.message.splitlines()]
    elif result.outcome is UpdateOutcome.STOPPED:
        stop = result.stop
        assert stop is not None
        lines.append(f"stopped at {stop.file}: {stop.reason}")
        if stop.conflicts:
            lines.append("conflicts in: " + ", ".join(stop.conflicts))
        lines += list(result.notes)
        lines.append(f"resolve it in {stop.worktree} (edit, then `git add`), or edit {stop.file} in the project's "
                     "patches/ and commit it; then run `vpatch update --continue`;")
        lines.append("or `vpatch update --abort` to leave the project as it was (your resolution is kept and the "
                     "next update replays it)")
    if plan.all_landed and result.outcome is not UpdateOutcome.STOPPED:
        lines.append(f"no local patch remains: the official vLLM {plan.to_ref} image now suffices")
    return lines


def furthest_lines(reach: Reach) -> list[str]:
    """`update --furthest`: where the pin went among the candidates, and what blocks the step after it."""
    choice = reach.choice
    if not choice.candidates:
        return []
    what = "releases" if choice.mode == "releases" else "first-parent commits"
    planned = reach.result.outcome.value == "planned"
    if choice.step is None:
        where = f"furthest: no step toward {choice.target.ref} goes without a person"
    else:
        verb = "would go" if planned else "went"
        where = (f"furthest: the pin {verb} to {choice.step.ref}" +
                 (" (the target)" if choice.step == choice.target else f", short of the target {choice.target.ref}"))
    lines = [f"{where}: {len(choice.checks)} checks over {len(choice.candidates)} {what} (at most {choice.bound})"]
    blocked = choice.blocked
    if blocked is not None:
        lines.append(f"blocked at {blocked.candidate.ref} ({blocked.candidate.commit[:12]}):")
        for b in blocked.blockers:
            lines.append(f"  {b.file}  [{b.case}] from {b.ref}: {b.reasons[0]}")
            lines += [f"  {'':<4}{r}" for r in b.reasons[1:]]
            lines.append(f"  {'':<4}a person runs: {b.run}")
    return lines
