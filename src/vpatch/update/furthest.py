"""How far the pin can go toward a target without a person (`update --to TARGET --furthest`): the newest release,
or first-parent commit, at or before the target where the update succeeds, and what blocks the step after it.

The candidates are the release tags between the pin and a release target, or the first-parent commits up to any
other target (a tracked branch). The search assumes what a person must resolve stays to be resolved (a conflict
does not heal by itself upstream), so it bisects: the target itself first, with every check the real run makes
(judging, narrowing, the probes re-validated); when that fails, the first candidate that needs a person, by the
judging and narrowing alone, in ceil(log2 K) checks; then the candidate before it once more with every check.
That is at most ceil(log2 K) + 2 checks for K candidates; when the full check refuses a step its judging passed
(a probe that no longer validates), the candidates below it are bisected again, in full. Each check is status's
verdict on that commit (probe results come from the probe cache, so no probe runs twice on one tree).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch import git
from vpatch.base import Event, ExitCode, Reporter, VpatchError, silent
from vpatch.update.plan import Action, PatchPlan, Refusal, Result, UpdateOutcome
from vpatch.upstream import direction_between, release_tags, release_version

if TYPE_CHECKING:
    from vpatch.config import Config


@dataclass(frozen=True)
class Candidate:
    ref: str  # a release tag, the target's own name, or a commit's 12-digit id
    commit: str


@dataclass(frozen=True)
class Blocker:
    """One patch that needs a person at the first candidate past the step, with every reason found there."""

    file: str
    case: str  # conflict, partial, disputed, contradiction, invalid-probe; `probe`: its probe does not validate
    # there; `refused`: another check of the real run refuses the move (a Live-Check: naming no file, ...)
    ref: str  # the first release (or commit) where it stops
    commit: str
    reasons: tuple[str, ...]
    run: str  # what a person runs to get past it

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "reasons": list(self.reasons)}


@dataclass(frozen=True)
class CandidateCheck:
    """One candidate judged: `full` with every check the real run makes, else by judging and narrowing alone."""

    candidate: Candidate
    ok: bool
    full: bool
    blockers: tuple[Blocker, ...] = ()


@dataclass(frozen=True)
class Choice:
    target: Candidate
    mode: str  # "releases" (release tags up to a release target) or "commits" (first-parent commits)
    candidates: tuple[Candidate, ...]  # oldest first, the target last
    step: Candidate | None  # where the pin goes; None: the first candidate already needs a person
    checks: tuple[CandidateCheck, ...]  # in the order they were made

    @property
    def bound(self) -> int:
        """The most checks the search makes when no full check refuses a step its judging passed."""
        return math.ceil(math.log2(len(self.candidates))) + 2 if self.candidates else 0

    @property
    def blocked(self) -> CandidateCheck | None:
        """The check of the candidate right after the step (None when the step is the target)."""
        if self.step == self.target:
            return None
        at = self.candidates.index(self.step) + 1 if self.step is not None else 0
        if at >= len(self.candidates):
            return None
        nxt = self.candidates[at]
        return next((c for c in reversed(self.checks) if c.candidate == nxt and not c.ok), None)

    @property
    def blockers(self) -> tuple[Blocker, ...]:
        blocked = self.blocked
        return blocked.blockers if blocked is not None else ()

    def to_json(self) -> dict[str, object]:
        return {"target": asdict(self.target), "mode": self.mode, "candidates": len(self.candidates),
                "step": None if self.step is None else asdict(self.step),
                "reached_target": self.step == self.target, "checks": len(self.checks), "bound": self.bound,
                "checked": [{**asdict(c.candidate), "ok": c.ok, "full": c.full} for c in self.checks]}

    def ahead_lines(self) -> tuple[str, ...]:
        """The commit message's words for what keeps the pin short of the target (none when it got there)."""
        blocked = self.blocked
        if blocked is None:
            return ()
        lines = [f"Not further: {blocked.candidate.ref} needs a person (the target was {self.target.ref}):"]
        for b in blocked.blockers:
            lines += [f"- {b.file}: {b.case} from {b.ref}: {b.reasons[0]}",
                      *(f"  Also: {r}" for r in b.reasons[1:]), f"  A person runs: {b.run}"]
        return tuple(lines)


@dataclass(frozen=True)
class Reach:
    """`update --furthest`: the choice, and the update to the chosen step (BLOCKED when there is none)."""

    choice: Choice
    result: Result

    def exit_code(self) -> ExitCode:
        if self.result.outcome is UpdateOutcome.STOPPED:
            return ExitCode.CONFLICT
        if self.result.outcome is UpdateOutcome.BLOCKED:
            return ExitCode.ATTENTION
        return ExitCode.OK if self.choice.blocked is None else ExitCode.PARTWAY

    def to_json(self) -> dict[str, object]:
        return {**self.result.to_json(), "furthest": self.choice.to_json(),
                "blockers": [b.to_json() for b in self.choice.blockers], "exit_code": int(self.exit_code())}


def candidates(repo: Path, config: Config, *, current: str, to: str, target: str) -> tuple[str, list[Candidate]]:
    """The mode and the candidates between the pin (excluded) and the target (included), oldest first: the
    release tags for a release target (direction_between: newer than the pin, not newer than the target), else
    the first-parent commits, named by their 12-digit id (the target by its own name)."""
    branch = config.upstream.branch
    if release_version(to) is not None and git.resolve_commit(repo, f"refs/tags/{to}") is not None:
        top = release_version(to)
        tags = [t for t in release_tags(git.tags(repo, "v*"))
                if release_version(t) <= top]  # type: ignore[operator]
        commits = git.resolve_commits(repo, tags)
        found: list[Candidate] = []
        for tag in tags:
            commit = commits[tag]
            if commit is None or commit == current or any(c.commit == commit for c in found):
                continue
            newer = direction_between(repo, current=current, current_ref=config.pin.ref, target=commit,
                                      target_ref=tag, branch=branch).forward
            within = commit == target or direction_between(repo, current=commit, current_ref=tag, target=target,
                                                           target_ref=to, branch=branch).forward
            if newer and within:
                found.append(Candidate(to if commit == target else tag, commit))
        return "releases", found
    base = current if git.is_ancestor(repo, current, target) else git.merge_base(repo, current, target)
    if base is None:
        raise VpatchError(f"{to} shares no history with the pin {config.pin.ref}: there is nothing to step through",
                          hint=f"vpatch update --to {to} (without --furthest) moves the pin there in one step")
    line = git.first_parent_commits(repo, base, target)
    return "commits", [Candidate(to if c == target else c[:12], c) for c in line]


# candidate -> the check of it
Checker = Callable[[Candidate], CandidateCheck]


def choose(target: Candidate, mode: str, line: Sequence[Candidate], *, judged: Checker, full: Checker,
           report: Reporter = silent) -> Choice:
    """The newest candidate of `line` (oldest first, ending at `target`) where `full` passes; see the module."""
    checks: list[CandidateCheck] = []

    def run(i: int, how: Checker) -> bool:
        report(Event(f"furthest: {line[i].ref}", "checking", f"{len(checks) + 1} of at most "
                     f"{math.ceil(math.log2(len(line))) + 2} checks over {len(line)} candidates"))
        check = how(line[i])
        checks.append(check)
        report(Event(f"furthest: {line[i].ref}", "ok" if check.ok else "needs a person", final=True,
                     detail=("at " + ", ".join(b.file for b in check.blockers)) if check.blockers else ""))
        return check.ok

    def chosen(step: int) -> Choice:
        return Choice(target, mode, tuple(line), line[step] if step >= 0 else None, tuple(checks))

    if not line:
        return chosen(-1)
    bad = len(line) - 1
    if run(bad, full):
        return chosen(bad)
    lo = 0  # every candidate below `lo` passes its judging; `bad` needs a person
    while lo < bad:
        mid = (lo + bad) // 2
        if run(mid, judged):
            lo = mid + 1
        else:
            bad = mid
    if bad == 0 or run(bad - 1, full):
        return chosen(bad - 1)
    # the full check refused what the judging passed (a probe that no longer validates): bisect again below it,
    # each check in full
    lo, bad = 0, bad - 1
    while lo < bad:
        mid = (lo + bad) // 2
        if run(mid, full):
            lo = mid + 1
        else:
            bad = mid
    return chosen(bad - 1)

def blockers_of(rows: Sequence[PatchPlan], at: Candidate, target: str | None = None) -> tuple[Blocker, ...]:
    """The patches a person must resolve at `at`: those whose disposition there stops or refuses."""
    out = []
    for row in rows:
        if row.action not in (Action.STOP, Action.REFUSE):
            continue
        case = row.state
        if row.refused_by in (Refusal.INVALID_PROBE, Refusal.PROBE):
            case = row.refused_by.value
        elif row.refused_by is not None:
            case = "refused"  # another step refuses the move (a Live-Check: naming no file, a move's proof)
        reasons = tuple(r for r in (row.refused or row.decided_by, *row.note.splitlines()) if r)
        out.append(Blocker(row.file, case, at.ref, at.commit, reasons or (f"{row.state} on {at.ref}",),
                           person_runs(row.file, case, at.ref, target)))
    return tuple(out)


def person_runs(file: str, case: str, ref: str, target: str | None = None) -> str:
    """What a person runs to get a patch past `ref` on the way to `target` (the update's own target, named in the
    hint: an update to `ref` alone would stop short of it), by its case."""
    number = file[:4]
    if case == "refused":
        return f"vpatch update --to {ref} --dry-run (it says what refuses the move); fix it and commit it"
    if case in ("invalid-probe", "probe"):
        return (f"vpatch probe check {number} (the probe must fail on the pin and pass with the patch); fix the "
                "probe or the patch and commit it")
    if case == "disputed":
        return (f"vpatch status --against {ref} (the evidence disagrees); decide {file} by hand, or fix its probe "
                "so that it decides")
    since = f" (from {ref} on)" if target and target != ref else ""
    return (f"vpatch update --to {target or ref}: it stops at {file}{since}; resolve it in "
            ".git/vpatch-update/tree, `git add`, vpatch update --continue")

