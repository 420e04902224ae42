"""How status results are shown: a rich table for people, a JSON document for CI. Nothing here prints."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vpatch.report.disposition import cell_words, disposition_json
from vpatch.upstream import HunkMove, Move
from vpatch.verdict import Applies, Evidence, Kind, Says, State, Verdict, classify

if TYPE_CHECKING:
    from rich.console import RenderableType

    from vpatch.series import Forwarded
    from vpatch.status import Landing, PatchStatus, Status
    from vpatch.update import Dispositions, PatchPlan

JSON_VERSION = 1
_STYLE = {State.LANDED: "green", State.NEEDED: "default", State.PARTIAL: "yellow", State.CONFLICT: "red",
          State.DISPUTED: "magenta"}


def status_json(status: Status, dispositions: Dispositions, forwarded: Mapping[str, Forwarded] | None = None) -> dict[str, Any]:
    """The --json document: pin, targets, one entry per patch with a result per target (its verdict, and from the
    pin on its disposition: what an update to that target does with it), its landing, and where it was sent
    upstream (`forwarded`: file -> its Forwarded:/Upstream-PR:, docs/forwarding.md)."""
    sent = forwarded or {}
    return {
        "version": JSON_VERSION,
        "source": "git" if status.history else "releases",
        "pin": {"ref": status.pin.ref, "commit": status.pin.commit},
        "targets": [t.ref for t in status.targets],
        "commits": {t.ref: t.commit for t in status.targets},
        "patches": [
            {
                "number": p.number,
                "slug": p.slug,
                "file": p.file,
                "subject": p.subject,
                "results": {t.ref: {**_verdict_json(v), **_disposition_json(status, p, v,
                                                                            dispositions.at(t.ref, p.file))}
                            for t, v in zip(status.targets, p.results)},
                "landed_in": _landing_json(p.landed_in, status.branch),
                "forwarded": sent[p.file].to_json() if p.file in sent else None,
            }
            for p in status.patches
        ],
        "probes": {"run": status.probes_run, "cached": status.probes_cached, "errors": status.probe_errors,
                   "problems": [{"file": file, "why": why} for file, why in status.probe_problems()]},
        "bisect_checks": status.bisect_checks,
        "regressions": [{"file": file, "why": why} for file, why in _regressions(dispositions)],
        "exit_code": int(dispositions.exit_code()),
    }


def _disposition_json(status: Status, p: PatchStatus, v: Verdict, row: PatchPlan | None) -> dict[str, Any]:
    """The case on that target and, from the pin on, the disposition there (update/disposition.py); a target
    older than the pin has its case only (no update goes there)."""
    if row is None:
        pin = p.results[status.targets.index(status.pin)] if status.pin in status.targets else None
        case = classify(v, pin=pin, pin_ref=status.pin.ref).case
        return {"case": case.value, "action": None, "regression": None, "disposition": None}
    return {"case": row.case.value, "action": row.action.value, "regression": row.regression or None,
            "disposition": disposition_json(row)}


def _regressions(dispositions: Dispositions) -> list[tuple[str, str]]:
    """(patch file, why) for each patch that breaks upstream's own tests on the pin: a person must look."""
    return list({r.file: r.regression for rows in dispositions.by_target.values() for r in rows
                 if r.regression}.items())


def _verdict_json(v: Verdict) -> dict[str, Any]:
    decided = v.decided_by
    return {
        "state": v.state.value,
        "summary": cell_summary(v),
        "decided_by": decided.kind.value if decided else None,
        "applies": v.applies.value,
        "evidence": [{"kind": ev.kind.value, "says": ev.says.value, "detail": ev.detail} for ev in v.evidence],
        "hunks": {"landed": list(v.landed_hunks), "needed": list(v.needed_hunks), "conflict": list(v.conflict_hunks)},
        "moves": [m.to_json() for m in v.moved],  # where the files it reads went since the pin (docs/moves.md)
        "hunk_moves": [m.to_json() for m in v.hunk_moves],  # where hunks' code went when not with its file
        # on the pin: upstream's own tests without and with the series (probes/regression.py)
        "upstream_tests": None if v.probe is None or not v.probe.tests else {
            "says": v.probe.tests, "regressions": list(v.probe.regressions)},
    }


def _landing_json(landing: Landing | None, branch: str) -> dict[str, Any] | None:
    if landing is None:
        return None
    return {
        "ref": landing.ref,
        "commit": landing.commit,
        "release": landing.release,
        "in_release": landing.release or f"on {branch}, in no release yet",
        "bisected": landing.bisected,
        "since": landing.since,
        "checks": landing.checks,
        "candidates": landing.candidates,
        "release_proof": None if landing.proof is None else {
            "commit": landing.proof.commit, "branch": landing.proof.branch, "cherry_pick": landing.proof.picked,
            "cherry_picked_from": landing.proof.original},
    }


def cell_summary(v: Verdict) -> str:
    """A few words on why: the deciding evidence, plus any fact that disagrees with it."""
    parts: list[str] = []
    decided = v.decided_by
    if decided is not None:
        parts.append(_short(decided, v))
    if v.state is not State.LANDED and decided is not None and decided.kind is Kind.PROBE:
        forward = next((ev for ev in v.evidence if ev.kind is Kind.FORWARD), None)
        if forward is not None:
            parts.append(_short(forward, v))
    if v.probe is not None and v.probe.regressions:
        parts.append(f"REGRESSION: breaks {len(v.probe.regressions)} upstream test"
                     + ("s" if len(v.probe.regressions) != 1 else ""))
    probe = next((ev for ev in v.evidence if ev.kind is Kind.PROBE), None)
    if probe is not None and probe is not decided:
        parts.append(_probe_short(v) if probe.says is Says.UNAVAILABLE else
                     {Says.LANDED: "probe passes", Says.NOT_LANDED: "probe fails"}[probe.says])
    if v.probe is not None:
        # where a files probe looked when its patch's code moved to another file (probes/follow.py)
        parts += [f"probe followed {m}" for m in v.probe.followed]
    for move in v.moved:
        # a followed move is named beside the verdict; one not followed is what decides (or is named with it),
        # unless each of its hunks followed its code (named below)
        if move.followed:
            parts.append(f"moved to {move.new}")
        elif not _resolved(move, v):
            parts.append(_lost(move))
    for hunk in v.hunk_moves:
        parts.append(f"{hunk.old} #{hunk.hunk} moved to {hunk.new}" if hunk.followed else _lost_hunk(hunk))
    revert = next((ev for ev in v.evidence if ev.kind is Kind.REVERT), None)
    if revert is not None and revert is not decided:
        parts.append("landed, then reverted upstream" if revert.says is Says.NOT_LANDED else "re-landed after a revert")
    if v.state is State.LANDED and decided is not None:
        # the textual fact beside whatever decided it, agreeing or not
        every = len(v.landed_hunks) + len(v.needed_hunks) + len(v.conflict_hunks)
        if v.applies is not Applies.NO:
            parts.append("diff still applies" + ("" if v.applies is Applies.CLEAN else f" ({v.applies.value})"))
        elif any(ev.kind is Kind.REVERSE and ev.says is Says.LANDED for ev in v.evidence):
            parts.append("reverse-applies")
        elif v.landed_hunks and every > len(v.landed_hunks):
            parts.append(f"diff partly upstream ({len(v.landed_hunks)}/{every} hunks)")
        elif decided.kind is not Kind.HUNKS:
            parts.append("old diff does not apply")
    return "; ".join(dict.fromkeys(parts))


def _probe_short(v: Verdict, limit: int = 100) -> str:
    """A probe that is no evidence here, with its reason: INVALID (it does not validate on the pin) or an error."""
    detail = v.probe.detail if v.probe is not None else ""
    if v.probe is not None and v.probe.invalid:
        # the rule's sentence (runner.validation's words, as update and `probe check` say them), less the probe's
        # name and the advice after "; ": "it fails on v1.0 without the patch and fails with it (...)"
        rule = detail.split("; ")[0]
        reason = "it " + rule.split(": it ", 1)[1] if ": it " in rule else re.sub(r"^probe \S+ ", "", rule)
        if reason.startswith("it passes on "):  # on the pin, the tree the patch is meant to fix
            return "probe INVALID (passes on the pin)"
        return "probe INVALID: " + (reason if len(reason) <= limit else reason[:limit] + "...")
    if v.probe is not None and v.probe.unfollowed:
        return ("probe not followed: a string of its check is in none of the patch's hunks whose code moved, "
                "where it is checked now is not guessed (fix the probe)")
    reason = detail or "no output"
    return "probe error: " + (reason if len(reason) <= limit else "..." + reason[-limit:])


def _short(ev: Evidence, v: Verdict) -> str:
    if ev.kind is Kind.PROBE:
        return "probe passes" if ev.says is Says.LANDED else "probe fails"
    if ev.kind is Kind.REVERSE:
        return "reverse-applies"
    if ev.kind is Kind.PATCH_ID:
        return "same patch-id as " + ev.detail.split()[2]
    if ev.kind is Kind.UPSTREAM_PR:
        return ev.detail.split('"')[0].strip()
    if ev.kind is Kind.DISAGREEMENT and ev.detail.startswith("both the pre-image"):
        return "pre- and post-image both in the file: a person must look"
    if ev.kind is Kind.DISAGREEMENT:
        return "identity says landed, content says not: " + ev.detail.split(",")[0]
    if ev.kind is Kind.REVERT:
        return ev.detail
    if ev.kind is Kind.MOVED:
        lost = next((m for m in v.moved if not m.followed and not _resolved(m, v)), None)
        if lost is not None:
            return _lost(lost)
        hunk = next((h for h in v.hunk_moves if not h.followed), None)
        return _lost_hunk(hunk) if hunk is not None else ev.detail
    if ev.kind is Kind.FORWARD:
        return {Applies.CLEAN: "applies cleanly", Applies.OFFSETS: "applies with offsets",
                Applies.THREE_WAY: "applies 3-way only", Applies.NO: "does not apply"}[v.applies]
    every = v.landed_hunks + v.needed_hunks + v.conflict_hunks
    if v.state is State.PARTIAL:
        # what an update does with it is the disposition's (narrowed only with narrow.py's proof), shown beside
        return f"{len(v.landed_hunks)}/{len(every)} hunks upstream: " + _hunks_short(v.landed_hunks, every)
    if v.conflict_hunks:
        return f"{len(v.conflict_hunks)}/{len(every)} hunks do not apply: " + _hunks_short(v.conflict_hunks, every)
    return ev.detail


def _resolved(move: Move, v: Verdict) -> bool:
    """Whether each hunk on a file that was deleted or split followed its code to a clear place (hunkmoves.py)."""
    return not move.followed and any(ev.kind is Kind.MOVED and ev.says is Says.NEUTRAL and ev.path == move.old
                                     for ev in v.evidence)


def _lost_hunk(hunk: HunkMove) -> str:
    names = ", ".join(f"{c.path} {c.score}%" for c in hunk.candidates)
    return f"{hunk.old} #{hunk.hunk}'s code: {names}; not guessed, a person must choose"


def _lost(move: Move) -> str:
    if move.via is not None and move.via not in dict(move.candidates):
        return f"{move.old} moved to {move.via}, then no file matches it: not guessed, a person must look"
    return f"{move.old} {move.fate.value} upstream, not guessed: a person must look"


def _hunks_short(names: tuple[str, ...], every: tuple[str, ...], limit: int = 6) -> str:
    """"ops/qsa.py #1 #3, qsa.py #5 (+2 more)": hunk numbers grouped by file, each file named by the
    shortest path tail that tells the patch's files apart."""
    paths = {name.partition(" hunk ")[0] for name in every}

    def tail(path: str) -> str:
        parts = path.split("/")
        for n in range(1, len(parts) + 1):
            short = "/".join(parts[-n:])
            if sum(1 for p in paths if p == short or p.endswith("/" + short)) == 1:
                return short
        return path

    groups: dict[str, list[str]] = {}
    for name in names[:limit]:
        path, _, rest = name.partition(" hunk ")
        groups.setdefault(tail(path), []).append("#" + rest.split()[0])
    text = ", ".join(f"{path} {' '.join(numbers)}" for path, numbers in groups.items())
    return text + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def landing_line(p: PatchStatus, branch: str) -> str:
    landing = p.landed_in
    if landing is None:
        return f"{p.file}: not landed in any target"
    release = f"first release {landing.proof or landing.release}" if landing.release else f"on {branch}, in no release yet"
    if landing.bisected and landing.candidates > 1:
        how = f"first commit {landing.commit[:12]} (bisected: {landing.checks} checks over {landing.candidates} commits)"
    elif landing.bisected:
        how = f"commit {landing.commit[:12]} (the only commit after {landing.since})"
    else:
        how = f"at or before commit {landing.commit[:12]}"
    return f"{p.file}: landed in {landing.ref}, {how}, {release}"


def forwarded_words(sent: Forwarded) -> str:
    """'forwarded (PR #N)', or the URL where it is no pull request."""
    return f"forwarded (PR #{sent.pr})" if sent.pr is not None else f"forwarded ({sent.url})"


def status_table(status: Status, dispositions: Dispositions, forwarded: Mapping[str, Forwarded] | None = None) -> RenderableType:
    """The table people read: one row per patch, one column per target (the verdict, then from the pin on the
    disposition: what an update to that target does), then a landing line per patch. A needed patch sent upstream
    says so in its cell (`forwarded`: file -> its Forwarded:/Upstream-PR:)."""
    from rich.console import Group  # lazy: rich loads only when something is shown; --help shows no table
    from rich.table import Table  # lazy: rich loads only when something is shown; --help shows no table
    from rich.text import Text  # lazy: rich loads only when something is shown; --help shows no table

    table = Table(show_lines=True)
    table.add_column("patch", no_wrap=True)
    for t in status.targets:
        table.add_column(t.ref + (" (pin)" if t == status.pin else ""), overflow="fold")
    for p in status.patches:
        cells = [Text(f"{p.number:04d} {p.slug}")]
        for t, v in zip(status.targets, p.results):
            cell = Text(v.state.value, style=f"bold {_STYLE[v.state]}")
            cell.append("\n" + cell_summary(v), style="dim")
            if v.state is State.NEEDED and forwarded and p.file in forwarded:
                cell.append("\n" + forwarded_words(forwarded[p.file]), style="cyan")
            row = dispositions.at(t.ref, p.file)
            if row is not None and t.commit != status.pin.commit:
                cell.append("\n" + cell_words(row), style="bold")
            cells.append(cell)
        table.add_row(*cells)
    lines = [Text(landing_line(p, status.branch)) for p in status.patches]
    invalid = set(status.invalid_probes())
    lines += [Text(f"{file}: its probe is INVALID: {why} (no evidence either way)" if file in invalid else
                   f"{file}: its probe could not decide {why}", style="bold red")
              for file, why in status.probe_problems()]
    lines += [Text(f"{file}: {why}", style="bold red") for file, why in _regressions(dispositions)]
    footer = f"probes: {status.probes_run} run, {status.probes_cached} from the cache"
    if status.probe_errors:
        footer += f", {status.probe_errors} could not decide"
    if status.bisect_checks:
        footer += f"; bisection: {status.bisect_checks} checks"
    if not status.history:
        footer += "; release history: patch-id and PR evidence not available"
    return Group(table, *lines, Text(footer, style="dim"))
