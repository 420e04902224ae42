"""How `vpatch deploy` shows a deploy: its tables and lines, and where the last one stands (--status)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vpatch.deploy import report as deploy_report

if TYPE_CHECKING:
    from rich.table import Table

    from vpatch.deploy import Report, Where


def status_lines(name: str, found: Where) -> list[str]:
    """The journal's phase and the containers it names; an unfinished deploy says how to restore production."""
    lines = []
    if found.journal is None:
        lines.append(f"no deploy of {name} is recorded on this host")
    else:
        j = found.journal
        lines.append(f"deploy of {name}: {j.phase.value} (started {j.started}, image {j.image})" + (f"; {j.note}" if j.note else ""))
        for role, cname, state in found.containers:
            lines.append(f"  {role:16} {cname:40} {state}")
        if not j.phase.settled:
            lines.append(f"unfinished: `vpatch deploy {name} --rollback` restores production")
    for other in found.others:
        # A renamed definition (tiny.yaml -> tiny2.yaml) finds the deploy it left under the old name.
        lines.append(f"unfinished: a deploy of {other.definition} ({other.phase.value}, started {other.started}) holds "
                     f"{other.container} (port {other.port}): `vpatch deploy {other.definition} --rollback` restores production")
    return lines


def tables(result: Report) -> list[Table]:
    """The checks, the baseline against the candidate, and (where there are any) the patches' live checks."""
    from rich.table import Table  # lazy: rich loads only when something is shown; --help shows no table

    checks = Table(title=f"deploy {result.definition}: {result.image} as {result.container}")
    for column in ("check", "baseline", "candidate", "figure", "s"):
        checks.add_column(column)
    for row in deploy_report.check_rows(result):
        checks.add_row(*row)
    figures = Table(title="baseline vs candidate")
    for column in ("figure", "baseline", "candidate"):
        figures.add_column(column)
    for frow in deploy_report.figure_rows(result):
        figures.add_row(*frow)
    shown = [checks, figures]
    rows = deploy_report.live_rows(result.live)
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
    shown.append(f"decision: {result.decision.value}" + (f" ({failed.name} failed)" if failed else ""))
    shown.append(result.rollback)
    for hook in result.hooks:
        shown.append(f"after_switch hook failed: {hook}")
    for alarm in result.live.alarms if result.live else []:
        shown.append(alarm)
    return shown
