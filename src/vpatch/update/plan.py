"""The plan of a pin move: one row per patch, holding its disposition (what the update does with it, decided
once in disposition.py), and the commit message that records what was done."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vpatch.series import RETIRED_FILE, Patch, Series
from vpatch.update.narrow import Narrowing, message_lines
from vpatch.update.retarget import message_lines as moved_lines
from vpatch.verdict import Case

if TYPE_CHECKING:
    from vpatch.config import Config
    from vpatch.status import Status


class Action(str, Enum):
    """What an update does with a patch on a target: the one action of a disposition."""

    DROP = "drop"  # landed upstream: the file goes, RETIRED.md records why
    CARRY = "carry"  # re-applied on the new pin as it is (re-exported when its file changes)
    NARROW = "narrow"  # carried without the hunks upstream has or rewrote, with proof (narrow.py)
    STOP = "stop"  # the update stops at it in the update tree: a person must resolve it
    REFUSE = "refuse"  # the update does not start: what it would lean on must be fixed first


class Refusal(str, Enum):
    """Which step of the disposition refused a patch (disposition.py)."""

    INVALID_PROBE = "invalid-probe"  # its probe does not validate on the pin: no evidence either way
    PROBE = "probe"  # its probe does not validate on the new pin with the carried patches (or cannot be followed)
    LIVE_CHECK = "live-check"  # a drop whose Live-Check: names no file
    MOVE_PROOF = "move-proof"  # a re-targeted patch whose result is not the old patch's


# the words for what the update does (done) and would do (a dry run, status)
_VERBS = {
    Action.DROP: ("drop", "would drop"),
    Action.CARRY: ("keep", "would re-apply"),
    Action.NARROW: ("narrow", "would narrow"),
    Action.STOP: ("stop at", "would stop at"),
    Action.REFUSE: ("refuse", "would refuse"),
}


class UpdateOutcome(str, Enum):
    PLANNED = "planned"  # --dry-run: nothing changed
    COMMITTED = "committed"
    STAGED = "staged"  # --no-commit: the changes are in the index and work tree
    STOPPED = "stopped"  # on a conflict; state kept for --continue / --abort
    ABORTED = "aborted"
    UP_TO_DATE = "up-to-date"  # --to names the pinned commit: nothing to do, nothing changed
    BLOCKED = "blocked"  # --furthest: the first step toward the target already needs a person; nothing changed


@dataclass(frozen=True)
class PatchPlan:
    file: str
    subject: str
    case: Case  # the case its verdicts put it in on the new pin (verdict/case.py)
    action: Action  # the disposition (disposition.py): what the update does with it
    decided_by: str  # the evidence that set the state
    evidence: tuple[str, ...]  # every fact, strongest first
    landed_in: str | None = None  # Applied-Upstream: "v0.30.0 (commit 1a2b3c4d5e6f, release v0.30.0)"
    upstream_pr: str | None = None
    narrowing: Narrowing | None = None  # partial, narrowed (narrow.py): applied without the hunks upstream has
    note: str = ""  # partial, not narrowed: why, and which hunks upstream already has
    moves: tuple[str, ...] = ()  # where the files it reads went since the pin, in words (moves.Move)
    retarget: tuple[tuple[str, str], ...] = ()  # (old, new) of each move followed: the patch goes on at `new`
    move_proof: str = ""  # re-targeted: why the result is what `git am -3` of the old patch gives
    # (old path, hunk, new path, line, image) of each hunk whose code moved to another file (hunkmoves.py)
    relocate: tuple[tuple[str, int, str, int, str], ...] = ()
    probe_moves: tuple[str, ...] = ()  # its `files` probe's checks that followed the code or files (probefollow.py)
    refused: str = ""  # REFUSE: what it leans on that does not hold, in words
    refused_by: Refusal | None = None  # REFUSE: which step refused it
    refused_hint: str = ""  # REFUSE: what a person does about it, where the step that refused it says
    validated: str = ""  # carried or narrowed: its probe (Probe: trailer) re-validated on the new pin plus the rest
    validated_detail: str = ""  # what that re-validation said
    # a person looks although the action stands: the probe could not decide there, or the patch breaks upstream's
    # own tests on the pin (probes/regression.py)
    probe_trouble: str = ""
    regression: str = ""
    refreshed: bool = False  # carried and its file re-exported changed (known after the update's export)

    @property
    def state(self) -> str:
        """The state word a person reads (the case's label)."""
        return self.case.label

    def verb(self, *, planned: bool) -> str:
        """What the update does (or, `planned`, would do) with it, in the disposition's words."""
        if self.action is Action.CARRY and self.refreshed and not planned:
            return "refresh"
        return _VERBS[self.action][1 if planned else 0]

    @property
    def needs_person(self) -> bool:
        """A stop or a refusal, or a probe trouble or regression a person must look at (`status --exit-code` 4)."""
        return self.action in (Action.STOP, Action.REFUSE) or bool(self.probe_trouble or self.regression)


@dataclass(frozen=True)
class UpdatePlan:
    from_ref: str
    from_commit: str
    to_ref: str
    to_commit: str
    patches: tuple[PatchPlan, ...]
    report: Status | None = field(default=None, compare=False, repr=False)  # the judging, for display
    ahead: tuple[str, ...] = ()  # --furthest short of its target: what blocks going further (commit message lines)

    def exported(self, file: str, *, changed: bool) -> UpdatePlan:
        """The plan once `file` is re-exported: refreshed when its file changed; a stop a person resolved went in."""
        return replace(self, patches=tuple(
            replace(p, refreshed=changed, action=Action.CARRY if p.action is Action.STOP else p.action)
            if p.file == file else p for p in self.patches))

    def files(self, *actions: Action) -> list[str]:
        return [p.file for p in self.patches if p.action in actions]

    @property
    def refused(self) -> list[PatchPlan]:
        return [p for p in self.patches if p.action is Action.REFUSE]

    @property
    def all_landed(self) -> bool:
        return all(p.action is Action.DROP for p in self.patches)

    def to_dict(self) -> dict[str, object]:
        return {"from_ref": self.from_ref, "from_commit": self.from_commit, "to_ref": self.to_ref,
                "to_commit": self.to_commit,
                "patches": [{**asdict(p), "case": p.case.value, "state": p.state, "action": p.action.value,
                             "refused_by": p.refused_by.value if p.refused_by else None}
                            for p in self.patches],
                "ahead": list(self.ahead)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UpdatePlan:
        rows = data["patches"]
        assert isinstance(rows, list)

        # a plan journaled before cases were recorded has the state word only: it names the case
        patches = tuple(PatchPlan(**{**{k: v for k, v in r.items() if k != "state"},
                                     "case": Case(r.get("case") or r["state"]),
                                     "action": _action(r), "evidence": tuple(r["evidence"]),
                                     "refreshed": bool(r.get("refreshed")) or r["action"] == "refresh",
                                     "refused_by": Refusal(r["refused_by"]) if r.get("refused_by") else None,
                                     "moves": tuple(r.get("moves", ())),
                                     "probe_moves": tuple(r.get("probe_moves", ())),
                                     "retarget": tuple((str(o), str(n)) for o, n in r.get("retarget", ())),
                                     "relocate": tuple((str(o), int(h), str(n), int(at), str(image))
                                                       for o, h, n, at, image in r.get("relocate", ())),
                                     "narrowing": Narrowing.from_dict(r["narrowing"]) if r.get("narrowing") else None})
                        for r in rows)
        return cls(str(data["from_ref"]), str(data["from_commit"]), str(data["to_ref"]), str(data["to_commit"]), patches,
                   ahead=tuple(str(line) for line in data.get("ahead", ())))


def _action(row: dict[str, Any]) -> Action:
    """A journaled row's action; a plan journaled before the one action enum says keep or refresh for a carried
    (or, with a narrowing, narrowed) patch."""
    if row["action"] in ("keep", "refresh"):
        return Action.NARROW if row.get("narrowing") else Action.CARRY
    return Action(row["action"])


@dataclass(frozen=True)
class Revalidation:
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
    outcome: UpdateOutcome
    plan: UpdatePlan
    commit: str | None = None  # the project commit (COMMITTED)
    message: str = ""  # the commit message (COMMITTED / STAGED)
    probes: tuple[Revalidation, ...] = ()
    stop: Stop | None = None
    notes: tuple[str, ...] = ()  # a person's work at a stop: what was taken in, set aside or replayed

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
            "refreshed": [p.file for p in self.plan.patches if p.refreshed],
            "kept": [p.file for p in self.plan.patches if p.action in (Action.CARRY, Action.NARROW) and not p.refreshed],
            # kept or refreshed without the hunks upstream has or rewrote (narrow.py); also in refreshed/kept
            "narrowed": [p.file for p in self.plan.patches if p.narrowing is not None],
            "probes": [asdict(p) for p in self.probes],
            "commit": self.commit,
            "message": self.message or None,
            "stop": None if self.stop is None else {**asdict(self.stop), "worktree": str(self.stop.worktree)},
            "notes": list(self.notes),
            "no_local_patch_remains": self.all_landed and self.outcome not in (UpdateOutcome.STOPPED,
                                                                               UpdateOutcome.UP_TO_DATE,
                                                                               UpdateOutcome.BLOCKED),
        }


# (repo, config, series, pin commit, target ref, target commit) -> one PatchPlan per patch, in series order,
# and the status report they came from (shown by --dry-run; None when there is none).
Judge = Callable[[Path, "Config", Series, str, str, str], "tuple[list[PatchPlan], Status | None]"]
# (repo, config, patch, base commit, patched commit) -> the probe re-validated on the new pin.
Validator = Callable[[Path, "Config", Patch, str, str], Revalidation]



def commit_message(plan: UpdatePlan, probes: Sequence[Revalidation] = ()) -> str:
    """One message naming every patch: dropped with its evidence and landing point, refreshed, kept."""

    narrowed = [p for p in plan.patches if p.narrowing is not None]
    dropped, refreshed, kept = (plan.files(Action.DROP), _unnarrowed(plan, refreshed=True),
                                _unnarrowed(plan, refreshed=False))
    subject = f"Update upstream pin {plan.from_ref} -> {plan.to_ref}"
    verbs = ([f"drop {', '.join(f[:4] for f in dropped)}"] if dropped else []) + (
        [f"narrow {', '.join(p.file[:4] for p in narrowed)}"] if narrowed else [])
    if verbs:
        subject += ": " + ", ".join(verbs)
    lines = [subject, "", f"Pin: {plan.from_ref} ({plan.from_commit[:12]}) -> {plan.to_ref} ({plan.to_commit[:12]})"]
    rows = {p.file: p for p in plan.patches}
    if narrowed:

        lines += ["", f"Narrowed, the hunks upstream already has (or rewrote, with proof) dropped (recorded in {RETIRED_FILE}):"]
        for row in narrowed:
            assert row.narrowing is not None
            lines += message_lines(row.subject, row.narrowing)
            lines += moved_lines(row)
    if dropped:
        lines += ["", f"Dropped, landed upstream (recorded in {RETIRED_FILE}):"]
        for f in dropped:
            r = rows[f]
            lines += [f"- {f}: {r.subject}", f"  Applied-Upstream: {r.landed_in}", f"  Evidence: {r.decided_by}"]
            lines += [f"  Also: {e}" for e in r.evidence if e != r.decided_by]
    if refreshed:
        lines += ["", f"Refreshed, re-exported against {plan.to_ref}:"]
        for f in refreshed:
            lines += [f"- {f}: {rows[f].state}: {rows[f].decided_by}", *moved_lines(rows[f])]
    if kept:
        lines += ["", "Kept, unchanged:"]
        lines += [f"- {f}: {rows[f].state}: {rows[f].decided_by}" for f in kept]
    checked = [p for p in probes if p.probe]
    if checked:
        lines += ["", f"Probes re-validated on {plan.to_ref} (fail without the patch, pass with it):"]
        lines += [f"- {p.file}: {p.probe}" + (f" ({p.detail})" if p.detail else "") for p in checked]
    if plan.all_landed:
        lines += ["", f"No local patch remains: the official vLLM {plan.to_ref} image now suffices."]
    if plan.ahead:
        lines += ["", *plan.ahead]
    return "\n".join(lines) + "\n"


def _unnarrowed(plan: UpdatePlan, *, refreshed: bool) -> list[str]:
    return [p.file for p in plan.patches if p.action is Action.CARRY and p.refreshed is refreshed]
