"""The disposition of each patch on a target: drop, carry, narrow, stop or refuse, decided once, with the proof it
rests on. `vpatch status` shows it for every target, `update --dry-run` prints it, `update` (and `--furthest`,
and scripts/ci-rebuild through them) carries it out: none of them judges again.

`dispose` walks the steps in order, each on the rows the step before left:

1. the case (verdict/case.py) gives the first action: landed drops, needed carries, partial or conflicting
   narrows where step 2 proves it, a lost move, disputed evidence or a patch landed on its own pin stops, an
   INVALID probe refuses (a probe that does not validate on the pin is no evidence: docs/probes.md);
2. narrowing (narrow.py): a partial patch without the hunks upstream has, a conflicting one through upstream's
   rewrite where its probe proves it; else it stops with why;
3. a drop whose Live-Check: names no file refuses (the deploy after it would fail);
4. the carried patches applied in memory on the new pin, as the update tree will hold them: a re-targeted
   patch's proof, a `files` probe followed to where its code went, each probe re-validated on the new pin plus
   the carried patches up to it. What does not hold refuses.

A row the update tree alone can tell (a patch that only merges 3-way after another) is left to the real run.
"""

from __future__ import annotations

import datetime
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch import status, upstream
from vpatch.base import Event, ExitCode, ProcessError, Reporter, VpatchError, silent
from vpatch.probes import Witness, default_jobs, hunk_coverage
from vpatch.series import Patch, Series
from vpatch.update import decided, guard, narrow, probefollow, retarget
from vpatch.update.plan import Action, PatchPlan, Refusal, Revalidation, UpdatePlan, Validator
from vpatch.verdict import Case, Kind, Says, classify, judge_series

if TYPE_CHECKING:
    from vpatch.config import Config
    from vpatch.status import Landing, Status
    from vpatch.verdict import Verdict

# the first action of each case (step 1); narrowing (step 2) decides a partial or conflicting patch
_FIRST = {
    Case.LANDED: Action.DROP,
    Case.NEEDED: Action.CARRY,
    Case.PARTIAL: Action.NARROW,
    Case.CONFLICT: Action.STOP,
    Case.MOVED_LOST: Action.STOP,
    Case.DISPUTED: Action.STOP,
    Case.CONTRADICTION: Action.STOP,
    Case.INVALID_PROBE: Action.REFUSE,
}


def judge_with_status(
    repo: Path, config: Config, series: Series, current: str, to: str, target: str, *, progress: Reporter | None = None,
    landing: bool = True, evidence: Witness | None = None,
) -> tuple[list[PatchPlan], Status | None]:
    """Status's verdicts with the pin and the target as columns, and each patch's first action there (step 1).
    `landing=False` skips the landing search (--furthest's bisection checks: only the chosen step is committed).
    `evidence`: the command's Witness (default: one of its own, each probe run alone)."""
    pin = status.Target(config.pin.ref, current)
    targets = [pin] if target == current else [pin, status.Target(to, target)]
    report = status.compute_status(repo, series.patches, pin=pin, targets=targets,
                                   history=config.upstream.source == "git", branch=config.upstream.branch,
                                   evidence=evidence if evidence is not None else Witness(repo, config, report=progress),
                                   landing=landing, report=progress or silent)
    return first_rows(report, series, len(targets) - 1), report


def first_rows(report: Status, series: Series, column: int) -> list[PatchPlan]:
    """Step 1 for the target in `column` of `report`: each patch's case there (the pin's verdict beside it) and
    the action that case starts with."""
    pin_column = report.targets.index(report.pin) if report.pin in report.targets else None
    target = report.targets[column]
    rows = []
    for patch, row in zip(series.patches, report.patches):
        verdict = row.results[column]
        found = classify(verdict, pin=row.results[pin_column] if pin_column is not None else None,
                         pin_ref=report.pin.ref)
        action = _FIRST[found.case]
        landed_in = _landing_text(row.landed_in, target.ref, target.commit) if action is Action.DROP else None
        rows.append(PatchPlan(patch.filename, patch.subject, found.case, action, found.reason,
                              tuple(str(e) for e in verdict.evidence), landed_in, patch.trailer("Upstream-PR"),
                              moves=_move_words(verdict),
                              retarget=tuple((m.old, m.new) for m in verdict.moved if m.followed and m.new),
                              relocate=tuple((h.old, h.hunk, h.new, h.winner.line, h.winner.image)
                                             for h in verdict.hunk_moves if h.new and h.winner),
                              refused=found.reason if action is Action.REFUSE else "",
                              refused_by=Refusal.INVALID_PROBE if action is Action.REFUSE else None,
                              probe_trouble=found.probe_trouble, regression=found.regression))
    return rows


def _move_words(verdict: Verdict) -> tuple[str, ...]:
    """Where the files and hunks of a patch went, in words: a deleted or split file whose hunks all followed their
    code says so (its evidence item) instead of "a person must look"."""

    # the file's evidence item, when every hunk of it followed its code (it is neutral then: the fate no longer blocks)
    followed = {ev.path: ev.detail.removesuffix(" (below)") for ev in verdict.evidence
                if ev.kind is Kind.MOVED and ev.says is Says.NEUTRAL and ev.path}
    words = []
    for move in verdict.moved:
        said = followed.get(move.old) if not move.followed else None
        words.append(said if said is not None else str(move))
    return tuple(words) + tuple(str(h) for h in verdict.hunk_moves)


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


# --- the steps after the first --------------------------------------------------------------------------


def dispose(
    repo: Path, config: Config, series: Series, rows: list[PatchPlan], report: Status | None, *, current: str,
    to: str, target: str, validator: Validator | None, narrow_them: bool = True, work: Path | None = None,
    evidence: Witness | None = None,
) -> list[PatchPlan]:
    """Steps 2 to 4 (module docstring) on the first rows: every row's disposition on `target`. `validator`
    re-validates a probe (base, patched); None: no probe runs (narrowing through a rewrite stays unproven).
    `work`: a folder for the scratch trees of step 4 (default: a temporary one). `evidence`: the command's Witness,
    whose session (trees, warm interpreter, --jobs) and progress the per-hunk coverage runs share."""

    def validate(patch: Patch, base: str, tree: str) -> Revalidation:
        if patch.probe_path is None:
            return Revalidation(patch.filename, None, True, "no probe")
        if validator is None:  # nothing re-validated, so the row claims nothing of its probe
            return Revalidation(patch.filename, None, True, "not re-validated (no probes)")
        return validator(repo, config, patch, base, tree)

    if narrow_them:
        rows = narrow_rows(repo, config, series, rows, report, current, to, target,
                           (lambda patch, tree: validate(patch, target, tree)) if validator is not None else None,
                           evidence=evidence)
        if validator is None:  # no probe runs (status --no-probes): nothing proves a narrowing through a rewrite
            rows = [_unproven(r) for r in rows]
    rows = [_unnarrowed(r) for r in rows]
    rows = _live_checks(config, series, rows)
    plan = UpdatePlan(config.pin.ref, current, to, target, tuple(rows), report)
    if work is not None:
        return list(check_carried(repo, work, series, plan, validate).patches)
    with tempfile.TemporaryDirectory(prefix="vpatch-dispose-") as scratch:
        return list(check_carried(repo, Path(scratch), series, plan, validate).patches)


def without_probes(repo: Path, config: Config, series: Series, rows: list[PatchPlan], report: Status | None, *,
                   current: str, to: str, target: str, narrow_them: bool = True) -> list[PatchPlan]:
    """Steps 2 and 3 without running a probe: --furthest's quick checks while it bisects (the step it takes is
    disposed of in full). A narrowing through upstream's rewrite counts as proven here."""
    if narrow_them:
        rows = narrow_rows(repo, config, series, rows, report, current, to, target, None)
    return _live_checks(config, series, [_unnarrowed(r) for r in rows])


def _unproven(row: PatchPlan) -> PatchPlan:
    if row.narrowing is None or not any(h.rewritten for h in row.narrowing.dropped):
        return row
    return replace(row, action=Action.STOP if row.case is Case.CONFLICT else Action.NARROW, narrowing=None,
                   note="\n".join(n for n in (row.note, "not narrowed through upstream's rewrite: its probe did not run "
                                                        "(--no-probes), and only the probe proves it") if n))


def _unnarrowed(row: PatchPlan) -> PatchPlan:
    """A partial patch that narrowing did not prove stops for a person (its note says why)."""
    if row.action is Action.NARROW and row.narrowing is None:
        return replace(row, action=Action.STOP)
    return row


_COVERAGE_LOCKS: dict[tuple[str, str], threading.Lock] = {}  # (patch file, pin) -> held while its hunks are checked


def narrow_rows(
    repo: Path, config: Config, series: Series, rows: list[PatchPlan], report: Status | None, current: str, to: str,
    target: str, validate: Callable[[Patch, str], Revalidation] | None, *, evidence: Witness | None = None,
) -> list[PatchPlan]:
    """Step 2: partial patches narrowed where narrow.py proves it, else a note for the person (issue 14);
    conflicting ones narrowed through upstream's rewrite where their probe proves it (issue 43).
    `validate(patch, patched tree)` re-validates a narrowed patch's probe; None skips that, and the per-hunk
    coverage on the pin with it (--furthest's quick checks)."""

    def narrowable(row: PatchPlan) -> bool:
        return row.action is Action.NARROW or (row.case is Case.CONFLICT and row.action is Action.STOP)

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
        # on the old pin, with the series before it: does the probe fail without each hunk? (cached probe runs:
        # targets decided side by side ask it once, the others find its results in the cache)
        with _COVERAGE_LOCKS.setdefault((patch.filename, current), threading.Lock()):
            return _covered(patch)

    def _covered(patch: Patch) -> list[bool | None]:
        # in the command's session where there is one (its trees, its interpreter), reported as its other runs are
        found = hunk_coverage(repo, series.patches, patch, base=current, ref=config.pin.ref,
                              cache=evidence.cache if evidence else None, report=evidence.report if evidence else silent,
                              session=evidence.session if evidence else None)
        return [h.covered for h in found.hunks]

    # the verdicts followed upstream's moves: narrowing splits the patch as they judged it, at the new paths
    by_file = {r.file: r for r in rows}
    patches = [retarget.retargeted(p, by_file[p.filename]) if p.filename in by_file else p for p in series.patches]
    found = narrow.narrow_series(
        repo, patches, verdicts, [r.file for r in rows if r.action is Action.CARRY], pin=current,
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
            row = replace(row, action=Action.NARROW, narrowing=result)
        out.append(row)
    return out


def _live_checks(config: Config, series: Series, rows: list[PatchPlan]) -> list[PatchPlan]:
    """Step 3: a dropped patch's Live-Check: goes into RETIRED.md and the next deploy runs it against the new
    server to show the drop was right; one naming no file would only fail there, after the pin moved."""
    by_file = {p.filename: p for p in series}
    out = []
    for row in rows:
        patch = by_file[row.file]
        path = patch.live_check_path(config.root) if row.action is Action.DROP and patch.live_check else None
        if path is not None and not path.is_file():
            row = replace(row, action=Action.REFUSE, refused_by=Refusal.LIVE_CHECK,
                          refused=f"its Live-Check: {patch.live_check} names no file in the project",
                          refused_hint="a deploy runs that check against the new server to show the drop is right: "
                                       "add the file (docs/live-checks.md) or remove the trailer, then update again")
        out.append(row)
    return out


Validate = Callable[[Patch, str, str], Revalidation]  # (patch as applied, base, patched tree) -> the probe's check


def check_carried(repo: Path, work: Path, series: Series, plan: UpdatePlan, validate: Validate) -> UpdatePlan:
    """Step 4, on the carried patches applied in memory (guard.applied_in_memory) as the update tree will hold
    them: each re-targeted patch's proof, each `files` probe followed to where its code went, each probe on the new
    pin (must fail) and on the new pin plus the carried patches up to it (must pass). A row whose proof or probe
    does not hold refuses; the rows carry the proofs and the followed probes, as the real run shows them."""
    originals = {p.filename: p for p in series}
    by_file = as_applied(series, plan)
    applied = guard.applied_in_memory(repo, plan, by_file)
    rows = {p.file: p for p in plan.patches}
    for a in applied:
        row = rows[a.row.file]
        if row.action is Action.STOP or not (row.retarget or row.relocate):
            continue  # a stop: a person's first
        try:
            proof = retarget.prove_steps(repo, work, plan.to_commit, [(a.parent, a.tree, originals[row.file], row)])
        except ProcessError:
            raise
        except VpatchError as exc:
            rows[row.file] = replace(row, action=Action.REFUSE, refused=exc.message, refused_by=Refusal.MOVE_PROOF,
                                     refused_hint=exc.hint or "")
            continue
        rows[row.file] = replace(row, move_proof=proof.get(row.file, ""))
    plan = replace(plan, patches=tuple(rows[p.file] for p in plan.patches))
    plan, checked = follow_probes(work, repo, plan, originals, by_file)
    rows = {p.file: p for p in plan.patches}
    for a in applied:
        row = rows[a.row.file]
        if row.action in (Action.STOP, Action.REFUSE) or checked[row.file].probe_path is None:
            continue
        try:
            check = validate(checked[row.file], plan.to_commit, a.tree)
        except ProcessError:
            raise
        except VpatchError as exc:  # the probe cannot tell the bug from the fix there (Witness.validate)
            check = Revalidation(row.file, checked[row.file].trailer("Probe"), False, exc.message)
        rows[row.file] = (replace(row, validated=check.probe or "", validated_detail=check.detail)
                          if check.ok else replace(row, action=Action.REFUSE, refused_by=Refusal.PROBE, refused=(
                              f"its probe no longer validates on {plan.to_ref}: {check.detail}")))
    return replace(plan, patches=tuple(rows[p.file] for p in plan.patches))


def as_applied(series: Series, plan: UpdatePlan) -> dict[str, Patch]:
    """file -> the patch as the update applies it: a patch whose file or code moved at the new place (retarget.py),
    a narrowed one without the hunks upstream has (export compares with the file)."""
    narrowed = {p.file: p.narrowing for p in plan.patches if p.narrowing}
    rows = {p.file: p for p in plan.patches}
    moved = {p.filename: retarget.retargeted(p, rows[p.filename]) if p.filename in rows else p for p in series}
    return {f: narrowed[f].patch(p) if f in narrowed else p for f, p in moved.items()}


def follow_probes(work: Path, repo: Path, plan: UpdatePlan, originals: dict[str, Patch],
                  by_file: dict[str, Patch]) -> tuple[UpdatePlan, dict[str, Patch]]:
    """The plan with what each carried patch's `files` probe followed (probefollow.py), and file -> the patch as the
    update applies it, reading its probe as it will be written (the probe validated is the one committed). A probe
    string whose new place cannot be told refuses its row."""
    rows = {p.file: p for p in plan.patches}
    checked = dict(by_file)
    for file, row in rows.items():
        if row.action in (Action.DROP, Action.REFUSE) or file not in originals:
            continue
        try:
            found = probefollow.followed(repo, originals[file], row, pin=plan.from_commit, target=plan.to_commit)
        except ProcessError:
            raise
        except VpatchError as exc:
            rows[file] = replace(row, action=Action.REFUSE, refused=exc.message, refused_by=Refusal.PROBE,
                                 refused_hint=exc.hint or "")
            continue
        if found is not None:
            checked[file] = probefollow.validating(work, by_file[file], found)
            rows[file] = replace(row, probe_moves=found.lines)
    return replace(plan, patches=tuple(rows[p.file] for p in plan.patches)), checked


def disposition_of(repo: Path, config: Config, series: Series, file: str, target: str, *,
                   validator: Validator | None, evidence: Witness | None = None,
                   progress: Reporter | None = None) -> PatchPlan:
    """The disposition of patch `file` on `target` (a ref), as status shows it and `update --to target` carries it
    out: the one question another command asks (a patch landed there is refused by `vpatch forward`)."""
    current = upstream.pin_commit(repo, config)
    commit = upstream.resolve(repo, target)
    rows, report = judge_with_status(repo, config, series, current, target, commit, evidence=evidence,
                                     progress=progress)
    if commit != current:
        rows = dispose(repo, config, series, rows, report, current=current, to=target, target=commit,
                       validator=validator, evidence=evidence)
    found = next((r for r in rows if r.file == file), None)
    if found is None:
        raise VpatchError(f"no patch {file} in the series", hint="vpatch status lists the series' patch files")
    return found


# --- what the dispositions say as a whole ----------------------------------------------------------------


def refusal(plan: UpdatePlan) -> VpatchError | None:
    """The error of a move some disposition refuses (None: none does); the dry run and the real run raise it alike.
    Each refused patch is named once, with why; the hint is the refusing step's own where it has one."""
    refused = plan.refused
    if not refused:
        return None
    lines = [r.refused if r.refused.startswith(r.file) else f"{r.file}: {r.refused}" for r in refused]
    lines[0] = f"not moving the pin to {plan.to_ref}: {lines[0]}"
    hint = refused[0].refused_hint or (
        "fix what it names (a probe must fail on the pin without its patch and pass with it: vpatch probe check "
        "NNNN), commit, and run the update again; the project is unchanged")
    return VpatchError("\n".join(lines), hint=hint)


def exit_code(rows: Sequence[PatchPlan]) -> ExitCode:
    """What `status --exit-code` says for these dispositions: ATTENTION (4) when a person must resolve or look at
    one, else LANDED (3) when one is dropped or narrowed, else OK (0)."""
    if any(r.needs_person for r in rows):
        return ExitCode.ATTENTION
    if any(r.action in (Action.DROP, Action.NARROW) for r in rows):
        return ExitCode.LANDED
    return ExitCode.OK


@dataclass(frozen=True)
class Dispositions:
    """Every patch's disposition on each target (`status`): target ref -> the rows, in series order."""

    by_target: dict[str, tuple[PatchPlan, ...]]

    def at(self, ref: str, file: str) -> PatchPlan | None:
        return next((r for r in self.by_target.get(ref, ()) if r.file == file), None)

    def exit_code(self) -> ExitCode:
        return exit_code([r for rows in self.by_target.values() for r in rows])


def dispose_status(
    repo: Path, config: Config, series: Series, report: Status, *, validator: Validator | None,
    progress: Reporter = silent, evidence: Witness | None = None,
) -> Dispositions:
    """Each patch's disposition on the pin and every later target of `report`, as an update to that target
    decides it (the pin: step 1 alone, an update to it moves nothing). A target's dispositions are kept in the
    cache under everything they are decided from (the verdicts' facts, the series and its probes, both commits),
    so that a second `status` runs no step again."""
    out: dict[str, tuple[PatchPlan, ...]] = {}
    todo: dict[int, tuple[str, list[PatchPlan]]] = {}  # column -> its key, step 1's rows: decided below
    start = report.targets.index(report.pin) if report.pin in report.targets else 0
    for column, target in enumerate(report.targets):
        if column < start:
            continue
        rows = first_rows(report, series, column)
        if target.commit != report.pin.commit:
            key = decided.key(config, series, rows, pin=report.pin.commit, target=target, probes=validator is not None)
            cached = decided.load(key)
            if cached is None:
                todo[column] = (key, rows)
            else:
                rows = cached
        out[target.ref] = tuple(rows)

    def decide(column: int) -> list[PatchPlan]:
        target = report.targets[column]
        key, rows = todo[column]
        started = time.monotonic()
        rows = dispose(repo, config, series, rows, _two_columns(report, column), current=report.pin.commit,
                       to=target.ref, target=target.commit, validator=validator, evidence=evidence)
        decided.keep(key, UpdatePlan(config.pin.ref, report.pin.commit, target.ref, target.commit, tuple(rows)))
        took = time.monotonic() - started
        if took >= 1:  # the probes it ran said their own progress; this says what it was for
            progress(Event(f"disposition on {target.ref}", "decided", "narrowing, the probes re-validated",
                           final=True, seconds=took))
        return rows

    # The targets side by side: each one's probe runs and upstream's tests wait on a process, and the session's
    # --jobs places bound how many run at once, whichever target they are for.
    jobs = min(len(todo), evidence.session.jobs if evidence is not None and evidence.session is not None
               else default_jobs())
    if jobs <= 1:
        for column in todo:
            out[report.targets[column].ref] = tuple(decide(column))
        return Dispositions(out)
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="disposition")
    try:
        futures = {column: pool.submit(decide, column) for column in todo}
        for column, future in futures.items():
            out[report.targets[column].ref] = tuple(future.result())
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)  # what runs ends with the command's session (cancelled)
        raise
    pool.shutdown()
    return Dispositions({t.ref: out[t.ref] for t in report.targets if t.ref in out})


def _two_columns(report: Status, column: int) -> Status:
    """`report` as an update to the target in `column` judges it: the pin's column and that one."""
    pin = report.targets.index(report.pin) if report.pin in report.targets else 0
    keep = [pin, column]
    return replace(report, targets=tuple(report.targets[i] for i in keep),
                   patches=tuple(replace(p, results=tuple(p.results[i] for i in keep)) for p in report.patches))
