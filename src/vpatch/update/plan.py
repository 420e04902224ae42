"""The plan of a pin move: each patch's verdict on the new pin and what the update does with it."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vpatch import status
from vpatch.base import silent
from vpatch.probes import Witness, hunk_coverage
from vpatch.series import RETIRED_FILE, Patch, Series
from vpatch.update import narrow
from vpatch.update.narrow import Narrowing, message_lines
from vpatch.update.retarget import message_lines as moved_lines
from vpatch.update.retarget import retargeted
from vpatch.verdict import FOLLOWED_CODE, Action, Case, Decision, Kind, decide, judge_series, verb

if TYPE_CHECKING:
    from vpatch.base import Reporter
    from vpatch.config import Config
    from vpatch.status import Landing, Status
    from vpatch.update.narrow import Narrowing
    from vpatch.verdict import Verdict


class FileAction(str, Enum):
    DROP = "drop"  # landed upstream: the file goes, RETIRED.md records why
    REFRESH = "refresh"  # needed: re-applied on the new pin, the file re-exported (and it changed)
    KEEP = "keep"  # needed: re-applied on the new pin, the file is byte-identical
    STOP = "stop"  # partial or conflict: a person must resolve it in the update tree


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
    case: Case  # the decision's case on the new pin (decision.py): what the update does follows from it
    action: FileAction
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

    @property
    def state(self) -> str:
        """The state word a person reads (the case's label)."""
        return self.case.label

    def verb(self, *, planned: bool) -> str:
        """What the update does (or, `planned`, would do) with it, in the decision's words."""
        done = self.case.action
        if self.narrowing is not None:
            done = Action.NARROW  # a conflict narrowed through upstream's rewrite too
        if done is Action.NARROW and self.narrowing is None:
            done = Action.STOP  # not narrowed (or --no-narrow): a person resolves it
        if done is Action.STOP and self.action in (FileAction.REFRESH, FileAction.KEEP):
            done = Action.APPLY  # a person resolved it at the stop, and it went in
        if done is Action.REFUSE:  # it went on as its text said until a guard refuses it (_row_action)
            done = {FileAction.DROP: Action.DROP, FileAction.STOP: Action.STOP}.get(
                self.action, Action.APPLY)
        return verb(done, planned=planned, refreshed=self.action is FileAction.REFRESH)


@dataclass(frozen=True)
class UpdatePlan:
    from_ref: str
    from_commit: str
    to_ref: str
    to_commit: str
    patches: tuple[PatchPlan, ...]
    report: Status | None = field(default=None, compare=False, repr=False)  # the judging, for display
    ahead: tuple[str, ...] = ()  # --furthest short of its target: what blocks going further (commit message lines)

    def with_action(self, file: str, action: FileAction) -> UpdatePlan:
        return replace(self, patches=tuple(replace(p, action=action) if p.file == file else p for p in self.patches))

    def files(self, *actions: FileAction) -> list[str]:
        return [p.file for p in self.patches if p.action in actions]

    @property
    def all_landed(self) -> bool:
        return all(p.action is FileAction.DROP for p in self.patches)

    def to_dict(self) -> dict[str, object]:
        return {"from_ref": self.from_ref, "from_commit": self.from_commit, "to_ref": self.to_ref,
                "to_commit": self.to_commit,
                "patches": [{**asdict(p), "case": p.case.value, "state": p.state, "action": p.action.value}
                            for p in self.patches],
                "ahead": list(self.ahead)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UpdatePlan:
        rows = data["patches"]
        assert isinstance(rows, list)

        # a plan journaled before cases were recorded has the state word only: it names the case
        patches = tuple(PatchPlan(**{**{k: v for k, v in r.items() if k != "state"},
                                     "case": Case(r.get("case") or r["state"]),
                                     "action": FileAction(r["action"]), "evidence": tuple(r["evidence"]),
                                     "moves": tuple(r.get("moves", ())),
                                     "probe_moves": tuple(r.get("probe_moves", ())),
                                     "retarget": tuple((str(o), str(n)) for o, n in r.get("retarget", ())),
                                     "relocate": tuple((str(o), int(h), str(n), int(at), str(image))
                                                       for o, h, n, at, image in r.get("relocate", ())),
                                     "narrowing": Narrowing.from_dict(r["narrowing"]) if r.get("narrowing") else None})
                        for r in rows)
        return cls(str(data["from_ref"]), str(data["from_commit"]), str(data["to_ref"]), str(data["to_commit"]), patches,
                   ahead=tuple(str(line) for line in data.get("ahead", ())))


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
            "dropped": self.plan.files(FileAction.DROP),
            "refreshed": self.plan.files(FileAction.REFRESH),
            "kept": self.plan.files(FileAction.KEEP),
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



# --- judging: the verdict of each patch on the new pin -------------------------------------------


def judge_with_status(
    repo: Path, config: Config, series: Series, current: str, to: str, target: str, *, progress: Reporter | None = None,
    landing: bool = True, evidence: Witness | None = None,
) -> tuple[list[PatchPlan], Status | None]:
    """Verdicts from `vpatch status` (issue 6): the pin and the target as columns, the target decides.
    `landing=False` skips the landing search (--furthest's bisection checks: only the chosen step is committed).
    `evidence`: the command's Witness (default: one of its own, each probe run alone)."""

    pin = status.Target(config.pin.ref, current)
    targets = [pin] if target == current else [pin, status.Target(to, target)]
    report = status.compute_status(repo, series.patches, pin=pin, targets=targets, history=config.upstream.source == "git",
                            branch=config.upstream.branch,
                            evidence=evidence if evidence is not None else Witness(repo, config, report=progress),
                            landing=landing, report=progress or silent)
    rows = []
    for patch, row in zip(series.patches, report.patches):
        verdict = row.results[-1]
        # the pin is the first column; the target differs from it (an update to the pin is up to date)
        made = decide(verdict, pin=row.results[0], pin_ref=config.pin.ref)
        action = _row_action(made)
        landed_in = _landing_text(row.landed_in, to, target) if action is FileAction.DROP else None
        rows.append(PatchPlan(patch.filename, patch.subject, made.case, action, made.reason,
                              tuple(str(e) for e in verdict.evidence), landed_in,
                              patch.trailer("Upstream-PR"),
                              moves=_move_words(verdict),
                              retarget=tuple((m.old, m.new) for m in verdict.moved if m.followed and m.new),
                              relocate=tuple((h.old, h.hunk, h.new, h.winner.line, h.winner.image)
                                             for h in verdict.hunk_moves if h.new and h.winner)))
    return rows, report


def _move_words(verdict: Verdict) -> tuple[str, ...]:
    """Where the files and hunks of a patch went, in words: a deleted or split file whose hunks all followed their
    code says so (its evidence item) instead of "a person must look"."""

    followed = [ev.detail.removesuffix(" (below)") for ev in verdict.evidence
                if ev.kind is Kind.MOVED and FOLLOWED_CODE in ev.detail]
    words = []
    for move in verdict.moved:
        said = next((f for f in followed if f.startswith(f"{move.old} ")), None)
        words.append(said if said is not None and not move.followed else str(move))
    return tuple(words) + tuple(str(h) for h in verdict.hunk_moves)


def narrow_rows(
    repo: Path, config: Config, series: Series, rows: list[PatchPlan], report: Status | None, current: str, to: str,
    target: str, validate: Callable[[Patch, str], Revalidation] | None,
) -> list[PatchPlan]:
    """Partial patches narrowed where narrow.py proves it (then kept), else a note for the person (issue 14);
    conflicting ones narrowed through upstream's rewrite where their probe proves it (issue 43).
    `validate(patch, patched tree)` re-validates a narrowed patch's probe; None (a dry run) skips that, and the
    per-hunk coverage on the pin with it."""

    def narrowable(row: PatchPlan) -> bool:
        return row.case.action is Action.NARROW or (row.case is Case.CONFLICT and row.action is FileAction.STOP)

    if not any(narrowable(r) for r in rows):
        return rows
    verdicts = narrow.verdicts_of(report) or {
        v.patch: v for v in judge_series(repo, series.patches, target, pin=current, history=False,
                                         use_history_evidence=False)}

    def probe(patch: Patch, tree: str) -> str | None:
        assert validate is not None
        check = validate(patch, tree)
        return None if check.ok else check.detail or "it does not fail without the patch and pass with it"

    def covered(patch: Patch) -> list[bool | None]:
        # on the old pin, with the series before it: does the probe fail without each hunk? (cached probe runs)
        found = hunk_coverage(repo, series.patches, patch, base=current, ref=config.pin.ref)
        return [h.covered for h in found.hunks]

    # the verdicts followed upstream's moves: narrowing splits the patch as they judged it, at the new paths
    by_file = {r.file: r for r in rows}
    patches = [retargeted(p, by_file[p.filename]) if p.filename in by_file else p for p in series.patches]
    found = narrow.narrow_series(
        repo, patches, verdicts, [r.file for r in rows if r.action is FileAction.KEEP], pin=current,
        target=target, to_ref=to, today=datetime.datetime.now(datetime.UTC).date().isoformat(),
        branch=config.upstream.branch if config.upstream.source == "git" else None,
        validate=probe if validate is not None else None, covered=covered if validate is not None else None,
        pin_ref=config.pin.ref, originals={p.filename: p for p in series.patches})
    out = []
    for row in rows:
        result = found.get(row.file) if narrowable(row) else None
        if isinstance(result, str):
            row = replace(row, note="\n".join(n for n in (row.note, result) if n))
        elif result is not None:
            row = replace(row, action=FileAction.KEEP, narrowing=result)
        out.append(row)
    return out


# the row's action before narrowing and the export: a partial patch stops unless narrowing proves it (then it
# is kept), a re-applied one is kept until the export says it changed (refresh)
_ACTIONS = {Action.DROP: FileAction.DROP, Action.APPLY: FileAction.KEEP, Action.NARROW: FileAction.STOP,
            Action.STOP: FileAction.STOP}


def _row_action(made: Decision) -> FileAction:
    """A refusal goes on as the text decided, so that the guard's checks refuse it with what its probe does on
    the pin and the new pin; guard.refuse_invalid_probes refuses it last when none of them did."""
    if made.action is Action.REFUSE:
        return _ACTIONS[Case(made.state.value).action]
    return _ACTIONS[made.action]


def _landing_text(landing: Landing | None, to: str, target: str) -> str:
    if landing is None:
        return f"{to} (commit {target[:12]})"
    first = "first commit" if landing.bisected else "commit"
    if landing.release is None:
        return f"{landing.ref} ({first} {landing.commit[:12]}, in no release yet)"
    # one release: the first that has it (the target only says where it was found)
    proof = landing.proof
    picked = proof if proof is not None and (proof.commit != landing.commit or proof.picked or proof.original) else None
    return f"{landing.release} ({first} {landing.commit[:12]}" + (f"; in it as {picked}" if picked else "") + ")"


def commit_message(plan: UpdatePlan, probes: Sequence[Revalidation] = ()) -> str:
    """One message naming every patch: dropped with its evidence and landing point, refreshed, kept."""

    narrowed = [p for p in plan.patches if p.narrowing is not None]
    dropped, refreshed, kept = (plan.files(FileAction.DROP), _unnarrowed(plan, FileAction.REFRESH),
                                _unnarrowed(plan, FileAction.KEEP))
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


def _unnarrowed(plan: UpdatePlan, action: FileAction) -> list[str]:
    return [p.file for p in plan.patches if p.action is action and p.narrowing is None]
