"""How `vpatch deploy` shows a deploy: its tables and lines, its --json document, where the last one stands
(--status), and the rows (baseline and candidate side by side) that the tables and the HTML page
(deploy_html.py) both show."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from vpatch.deploy import CheckResult, Figures, LiveReport, Report, describe, live_json
from vpatch.report import deploy_verdict

if TYPE_CHECKING:
    from pathlib import Path

    from rich.table import Table  # lazy: rich loads only when a table is shown

    from vpatch.deploy import FleetReport, LivePlan, Pruned, Restored, Where


def status_lines(name: str, found: Where, host: str | None = None) -> list[str]:
    """The journal's phase and the containers it names; an unfinished deploy says how to restore production.
    `host`: the host of `hosts:` it stands on."""
    lines = []
    on = f" --host {host}" if host else ""
    if found.journal is None:
        lines.append(f"no deploy of {name} is recorded on " + (f"host {host}" if host else "this host"))
    else:
        j = found.journal
        of = f"{name} on host {host}" if host else name
        lines.append(f"deploy of {of}: {j.phase.value} (started {j.started}, image {j.image})" + (f"; {j.note}" if j.note else ""))
        for role, cname, state in found.containers:
            lines.append(f"  {role:16} {cname:40} {state}")
        if not j.phase.settled:
            lines.append(f"unfinished: `vpatch deploy {name}{on} --rollback` restores production")
    for other in found.others:
        # A renamed definition (tiny.yaml -> tiny2.yaml) finds the deploy it left under the old name.
        lines.append(f"unfinished: a deploy of {other.definition} ({other.phase.value}, started {other.started}) holds "
                     f"{other.container} (port {other.port}): `vpatch deploy {other.definition} --rollback` restores production")
    return lines


def tables(result: Report) -> list[Table]:
    """The checks, the baseline against the candidate, and (where there are any) the patches' live checks."""
    from rich.table import Table  # lazy: rich loads only when a table is shown

    checks = Table(title=f"deploy {result.definition}: {result.image} as {result.container}")
    for column in ("check", "baseline", "candidate", "figure", "s"):
        checks.add_column(column)
    for row in check_rows(result):
        checks.add_row(*row)
    figures = Table(title="baseline vs candidate")
    for column in ("figure", "baseline", "candidate"):
        figures.add_column(column)
    for frow in figure_rows(result):
        figures.add_row(*frow)
    shown = [checks, figures]
    cand = result.record.candidate if result.record else None
    base = result.record.baseline if result.record else None
    if cand is not None:
        for title, header, body in (
                ("start ledger (from each server's own log)", ("figure", "baseline", "candidate", "difference"),
                 deploy_verdict.ledger_table_rows(base, cand)),
                ("timings, repeated", ("figure", "baseline", "candidate", "call"),
                 deploy_verdict.timing_table_rows(base, cand)),
                ("memory per check phase (MiB)", ("check", "device", "baseline peak", "candidate peak", "difference",
                                                  "lowest free", "of"),
                 deploy_verdict.phase_table_rows(base, cand))):
            if body:
                table = Table(title=title)
                for column in header:
                    table.add_column(column)
                for brow in body:
                    table.add_row(*brow)
                shown.append(table)
    rows = live_rows(result.live)
    if rows:
        live = Table(title="live checks, per patch")
        for column in ("patch", "case", "baseline", "candidate", "candidate answered"):
            live.add_column(column)
        for lrow in rows:
            live.add_row(*lrow)
        shown.append(live)
    return shown


def lines(result: Report) -> list[str]:
    """What follows the tables: the live checks' notes, the steps, the decision, the rollback, hooks and alarms."""
    shown = []
    if result.live is not None:
        if result.live.plan.verified:
            shown.append(f"verified: {result.live.plan.verified}")
        for note in result.live.plan.notes:
            shown.append(f"live checks: {note}")
    shown.append("steps: " + ", ".join(f"{s.name} {s.seconds:.1f}s" for s in result.steps))
    failed = result.failed_check
    cand = result.record.candidate if result.record else None
    if cand is not None:
        base = result.record.baseline if result.record else None
        shown += deploy_verdict.compare_sides(base, cand).lines()
        if deploy_verdict.timing_table_rows(base, cand):
            shown.append(f"rule: {deploy_verdict.the_rule(cand.figures)}")
    shown.append(f"decision: {result.decision.value}" + (f" ({failed.name} failed)" if failed else ""))
    shown.append(result.rollback)
    for hook in result.hooks:
        shown.append(f"after_switch hook failed: {hook}")
    for alarm in result.live.alarms if result.live else []:
        shown.append(alarm)
    return shown



def plan_notes(plan: LivePlan) -> list[str]:
    """Before the switch, on stderr: what the live checks' plan says (a patch without one, a check left out)."""
    return [f"live checks: {note}" for note in plan.notes]


def page_line(path: Path) -> str:
    """Where the deploy's HTML page was written."""
    return f"report: {path}"


def rolled_back_line(restored: Restored) -> str:
    return f"rolled back: {describe(restored)}"


def prune_lines(pruned: Pruned) -> list[str]:
    """Each container removed, each kept and why; or that there was nothing to prune."""
    lines = [f"removed {name}" for name in pruned.removed]
    lines += [f"kept    {name} ({why})" for name, why in pruned.kept]
    if not pruned.removed:
        lines.append("nothing to prune")
    return lines

# The figures compared side by side, with how each is shown.
_FIGURES: tuple[tuple[str, str], ...] = (
    ("kv_pool_tokens", "KV pool (tokens)"),
    ("max_concurrency", "max concurrency"),
    ("tokens_per_block", "tokens per KV block held"),
    ("blocks_ratio", "blocks held / predicted"),
    ("ttft_s", "time to first token (median, s)"),
    ("decode_tps", "decode tokens/s (median)"),
    ("needles_found", "needles found"),
    ("questions_right", "questions right"),
    ("preemptions", "preemptions (parallel)"),
    ("log_findings", "log findings"),
)


def _show(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def figure_rows(report: Report) -> list[tuple[str, str, str]]:
    """(figure, baseline, candidate) for every figure either side measured."""
    return figure_rows_of(report.baseline.figures if report.baseline else Figures(), report.candidate.figures)


def figure_rows_of(base: Figures, cand: Figures) -> list[tuple[str, str, str]]:
    """figure_rows for two sides' figures (a deploy's, or a record's read back)."""
    rows = []
    for key, label in _FIGURES:
        b, c = getattr(base, key), getattr(cand, key)
        if b is not None or c is not None:
            if key == "max_concurrency":
                label += f" at {_show(cand.concurrency_tokens or base.concurrency_tokens)} tokens"
            rows.append((label, _show(b), _show(c)))
    return rows


def check_rows(report: Report) -> list[tuple[str, str, str, str, str]]:
    """(check, baseline status, candidate status, candidate figure and detail, seconds)."""
    return check_rows_of(report.baseline.checks if report.baseline else (), report.candidate.checks)


def check_rows_of(baseline: Sequence[CheckResult], candidate: Sequence[CheckResult]) -> list[tuple[str, str, str, str, str]]:
    """check_rows for two sides' checks."""
    base = {c.name: c for c in baseline}
    rows = []
    for check in candidate:
        b = base.get(check.name)
        text = check.figure + (f" - {check.detail}" if check.detail and check.failed else "")
        rows.append((check.name, b.status.value if b else "-", check.status.value, text, f"{check.seconds:.1f}"))
    return rows


def live_rows(live: LiveReport | None) -> list[tuple[str, str, str, str, str]]:
    """(patch and role, case, baseline, candidate, what the candidate answered) for every live-check case."""
    if live is None:
        return []
    base = {(o.planned.patch, c.name): c for o in live.baseline for c in o.cases}
    rows = []
    for outcome in live.candidate:
        for case in outcome.cases:
            b = base.get((outcome.planned.patch, case.name))
            seen = case.seen.summary() if case.seen else ""
            shown = seen if case.ok else "; ".join(case.problems)
            rows.append((f"{outcome.planned.patch} ({outcome.planned.role.value})", case.name,
                         "-" if b is None else ("pass" if b.ok else "fail"), "pass" if case.ok else "fail", shown))
    return rows


def _check(c: CheckResult) -> dict[str, Any]:
    return {"name": c.name, "status": c.status.value, "figure": c.figure, "detail": c.detail,
            "seconds": round(c.seconds, 2)}


def to_json(report: Report) -> dict[str, Any]:
    def outcome(o: Any) -> dict[str, Any] | None:
        if o is None:
            return None
        return {"checks": [_check(c) for c in o.checks], "figures": asdict(o.figures), "series": o.series.to_json(),
                "source": o.source, "recorded_at": o.recorded_at, "ledger": o.ledger.to_json()}

    failed = report.failed_check
    return {
        "definition": report.definition, "container": report.container, "image": report.image,
        "decision": report.decision.value, "exit_code": int(report.decision.exit_code),
        "failed_check": failed.name if failed else None,
        "baseline": outcome(report.baseline), "candidate": outcome(report.candidate),
        "steps": [{"name": s.name, "seconds": round(s.seconds, 2)} for s in report.steps],
        "parked_as": report.parked_as, "candidate_kept_as": report.candidate_kept_as,
        "rollback": report.rollback, "failed_hooks": list(report.hooks),
        "live": live_json(report.live), "alarms": report.live.alarms if report.live else [],
        "record": str(report.record.path) if report.record else None,
        "report": str(report.record.html_path) if report.record else None,
        **deploy_verdict.to_json(report.baseline.side(None) if report.baseline else None, report.candidate.side(None)),
    }


def fleet_json(result: FleetReport) -> dict[str, Any]:
    """`deploy --json` over hosts: each host's step (its own deploy's report, or its error) under its name."""
    hosts = []
    for step in result.steps:
        item: dict[str, Any] = {"host": step.host, "role": step.role.value, "deployed": step.deployed,
                                "error": step.error}
        if step.report is not None:
            item.update(to_json(step.report))
        hosts.append(item)
    return {"definition": result.definition, "image": result.image, "deployed": result.deployed,
            "halted_at": result.halted_at, "diverted": result.diverted,
            "answer": asdict(result.answer) if result.answer else None, "hosts": hosts}


def fleet_lines(result: FleetReport) -> list[str]:
    """Each host's step in order, what its deploy decided (which check failed, what was restored), the lane."""
    shown = []
    for step in result.steps:
        head = f"host {step.host} ({step.role.value}): "
        if step.report is None:
            shown.append(head + f"error, rolled back: {step.error}")
            continue
        failed = step.report.failed_check
        shown.append(head + step.report.decision.value + (f" ({failed.name} failed)" if failed else ""))
        shown.append(f"  {step.report.rollback}")
        if result.answer is not None and step.role.value == "standby" and step.deployed:
            shown.append(f"  answered a request at {result.answer.url}: {result.answer.tokens} tokens in "
                         f"{result.answer.seconds:.1f}s")
    if result.diverted:
        shown.append("lane: diverted to the standby (before_switch) before production was parked")
    if result.halted_at is not None:
        shown.append(f"halted at host {result.halted_at}: no later host was touched")
    return shown
