"""What the verdicts say about a patch before anything is decided: the case it is in (landed, needed, partial,
conflict, a lost move, disputed, landed on its own pin, its probe invalid), with the evidence that put it there.

The case is evidence, not a decision: what an update does with a patch in a case (drop, carry, narrow, stop,
refuse) is decided once, in update/disposition.py, which also runs the proof a drop or a narrowing rests on.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from vpatch.probes import ProbeOutcome
from vpatch.verdict.judge import Kind, Says, State, Verdict


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
    def label(self) -> str:
        """The state word a person reads in `[...]` (a lost move is a conflict to them)."""
        return State.CONFLICT.value if self is Case.MOVED_LOST else self.value


@dataclass(frozen=True)
class Finding:
    """A patch's case on a target, from its verdict there and its verdict on the pin."""

    case: Case
    state: State  # the verdict's own state on the target (what the text and the probe said there)
    reason: str  # the evidence that put it in the case, in words
    # the probe could not decide here (the text did): a person looks although the case stands
    probe_trouble: str = ""
    # the patch breaks upstream's own tests on the pin (probes/regression.py): a person looks
    regression: str = ""


def classify(verdict: Verdict, *, pin: Verdict | None, pin_ref: str) -> Finding:
    """The case of a patch from its verdict on a target and its verdict on the pin (None: not judged there)."""
    if pin is not None and pin.state is State.LANDED:
        return Finding(Case.CONTRADICTION, verdict.state, f"{verdict.patch} is landed on its own pin {pin_ref} "
                                           f"({pin.decided_by}): a person must look")
    probe = verdict.probe
    # a patch upstream has is dropped with whatever it broke; one still carried must not break upstream's tests
    broken = pin.probe.regressions if pin is not None and pin.probe is not None else ()
    regression = (f"breaks upstream's own tests on the pin {pin_ref}: {', '.join(broken)}"
                  if broken and verdict.state is not State.LANDED else "")
    if probe is not None and probe.invalid:
        return Finding(Case.INVALID_PROBE, verdict.state, f"its probe is INVALID: {probe.detail}",
                       regression=regression)
    trouble = probe.detail if probe is not None and probe.outcome is ProbeOutcome.ERROR else ""
    return Finding(_case(verdict), verdict.state, str(verdict.decided_by or ""), probe_trouble=trouble,
                   regression=regression)


def _case(verdict: Verdict) -> Case:
    if verdict.state is State.CONFLICT:
        decided = verdict.decided_by
        if decided is not None and decided.kind is Kind.MOVED and decided.says is Says.UNAVAILABLE:
            return Case.MOVED_LOST
    return Case(verdict.state.value)
