"""What happens to a patch next, decided once from its verdicts: the case it is in -> drop / narrow / re-apply /
stop for a person / refuse the move, with the reason, and what `status --exit-code` says about it.

`vpatch update`'s plan (update/plan.py), `vpatch status --exit-code` (Status.exit_code) and the update's
wording (`would drop`, `would stop at`, ...) all read `decide` and the table below, so the three cannot
disagree. The guard's veto (update/guard.py: a drop whose probe does not re-validate on the pin) is a
`Decision` of the same type, made after the judging.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from vpatch.base import ExitCode, VpatchError
from vpatch.probes import ProbeOutcome
from vpatch.verdict.judge import Kind, Says, State, Verdict


class Action(str, Enum):
    """What an update does with a patch in a case."""

    DROP = "drop"  # the file goes, RETIRED.md records why
    APPLY = "apply"  # re-applied on the new pin; re-exported (refresh) or byte-identical (keep)
    NARROW = "narrow"  # partial: narrowed where narrow.py proves it, else a person resolves it (as STOP)
    STOP = "stop"  # the update stops at it in the update tree: a person must resolve it
    REFUSE = "refuse"  # the update does not start: the probe it would lean on must be fixed first


class Case(str, Enum):
    """Every state a patch can be in when deciding what to do with it."""

    LANDED = "landed"  # upstream has the change
    NEEDED = "needed"  # applies, nothing says upstream has it
    PARTIAL = "partial"  # some hunks upstream, others not
    CONFLICT = "conflict"  # does not apply and has not landed
    MOVED_LOST = "moved-lost"  # a file it reads was deleted or split since the pin: not guessed
    DISPUTED = "disputed"  # the evidence contradicts itself and no probe decides
    CONTRADICTION = "contradiction"  # landed on its own pin: the series or the evidence is wrong
    INVALID_PROBE = "invalid-probe"  # its probe does not tell the bug from the fix on the pin: no evidence

    @property
    def action(self) -> Action:
        return _ACTION[self]

    @property
    def exit_code(self) -> ExitCode:
        """What `status --exit-code` says for a patch in this case: LANDED (3) for a drop, ATTENTION (4) for
        anything a person must resolve or fix, OK (0) for a re-apply."""
        if self.action is Action.DROP:
            return ExitCode.LANDED
        return ExitCode.OK if self.action is Action.APPLY else ExitCode.ATTENTION

    @property
    def label(self) -> str:
        """The state word a person reads in `[...]` (a lost move is a conflict to them)."""
        return State.CONFLICT.value if self is Case.MOVED_LOST else self.value


_ACTION = {
    Case.LANDED: Action.DROP,
    Case.NEEDED: Action.APPLY,
    Case.PARTIAL: Action.NARROW,
    Case.CONFLICT: Action.STOP,
    Case.MOVED_LOST: Action.STOP,
    Case.DISPUTED: Action.STOP,
    Case.CONTRADICTION: Action.STOP,
    Case.INVALID_PROBE: Action.REFUSE,
}

# the words for what the update does (done) and would do (--dry-run); APPLY's done word is refresh or keep
_VERBS = {
    Action.DROP: ("drop", "would drop"),
    Action.APPLY: ("keep", "would re-apply"),
    Action.NARROW: ("narrow", "would narrow"),
    Action.STOP: ("stop at", "would stop at"),
    Action.REFUSE: ("refuse", "would refuse"),
}


def verb(action: Action, *, planned: bool, refreshed: bool = False) -> str:
    """How the update's report words an action: done, or planned (a dry run)."""
    if action is Action.APPLY and refreshed and not planned:
        return "refresh"
    return _VERBS[action][1 if planned else 0]


@dataclass(frozen=True)
class Decision:
    case: Case
    state: State  # the verdict's own state on the target (what the text and the probe said there)
    reason: str  # the evidence that decided it, in words
    # status asks a person to look although the action stands: the probe could not decide here (the text did)
    probe_trouble: str = ""
    # the patch breaks upstream's own tests on the pin (probes/regression.py): a person looks; an update re-runs
    # them on its target and refuses to carry it while they break (Witness.validate)
    regression: str = ""

    @property
    def action(self) -> Action:
        return self.case.action

    @property
    def exit_code(self) -> ExitCode:
        """The case's exit code; ATTENTION when its probe could not decide here (a person looks at the probe) or the
        patch breaks upstream's own tests on the pin."""
        return ExitCode.ATTENTION if self.probe_trouble or self.regression else self.case.exit_code


def decide(verdict: Verdict, *, pin: Verdict | None, pin_ref: str) -> Decision:
    """The decision for a patch from its verdict on a target and its verdict on the pin (None: not judged there)."""
    if pin is not None and pin.state is State.LANDED:
        return Decision(Case.CONTRADICTION, verdict.state, f"{verdict.patch} is landed on its own pin {pin_ref} "
                                            f"({pin.decided_by}): a person must look")
    probe = verdict.probe
    # a patch upstream has is dropped with whatever it broke; one still carried must not break upstream's tests
    broken = pin.probe.regressions if pin is not None and pin.probe is not None else ()
    regression = (f"breaks upstream's own tests on the pin {pin_ref}: {', '.join(broken)}"
                  if broken and verdict.state is not State.LANDED else "")
    if probe is not None and probe.invalid:
        return Decision(Case.INVALID_PROBE, verdict.state, f"its probe is INVALID: {probe.detail}",
                        regression=regression)
    trouble = probe.detail if probe is not None and probe.outcome is ProbeOutcome.ERROR else ""
    return Decision(_case(verdict), verdict.state, str(verdict.decided_by or ""), probe_trouble=trouble,
                    regression=regression)


def _case(verdict: Verdict) -> Case:
    if verdict.state is State.CONFLICT:
        decided = verdict.decided_by
        if decided is not None and decided.kind is Kind.MOVED and decided.says is Says.UNAVAILABLE:
            return Case.MOVED_LOST
    return Case(verdict.state.value)


def worst(codes: Iterable[ExitCode]) -> ExitCode:
    """One exit code for many decisions: ATTENTION over LANDED over OK."""
    seen = set(codes)
    for code in (ExitCode.ATTENTION, ExitCode.LANDED):
        if code in seen:
            return code
    return ExitCode.OK


def vetoed(file: str, *, dropping: bool, pin_ref: str, detail: str) -> VpatchError:
    """The refusal (Action.REFUSE) of a move whose patch leans on a probe that does not validate on the pin: the
    guard's re-validation of a drop, and a probe status found INVALID that nothing else refused, say it alike."""
    if dropping:
        return VpatchError(f"not dropping {file}: its probe does not validate on the pin {pin_ref}: {detail}",
                           hint="the probe must fail on the pin and pass with the patch; fix it, commit, and run the "
                                "update again; the project is unchanged")
    return VpatchError(f"probe of {file} does not validate on the pin {pin_ref}: {detail}",
                       hint="the probe must fail on the pin without the patch and pass with it; fix the probe (or "
                            "the patch), commit, and run the update again; the project is unchanged")
