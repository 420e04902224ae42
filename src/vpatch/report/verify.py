"""How `vpatch verify` shows an image against its labels: one line per check, then the patches' live checks."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vpatch.deploy import LiveReport
    from vpatch.image import VerifyReport


def check_lines(report: VerifyReport) -> list[str]:
    """Each check of the image with its mark, and why where it says more."""
    return [f"{check.mark} {check.what}" + (f": {check.detail}" if check.detail else "") for check in report.checks]


def matched_line(image: str, report: VerifyReport) -> str:
    return f"image {image} matches its labels: {len(report.checks)} check(s) passed"


def live_lines(result: LiveReport) -> list[str]:
    """The live checks' notes, then each case of each patch's live check, passed or with its problems."""
    lines = [f"note {note}" for note in result.plan.notes]
    for outcome in result.candidate:
        for case in outcome.cases:
            shown = "" if case.ok else ": " + "; ".join(case.problems)
            lines.append(f"{'ok  ' if case.ok else 'FAIL'} live {outcome.planned.patch}: {case.name}{shown}")
    return lines


def live_summary(result: LiveReport) -> str:
    """The last line of a live verify that passed: how many cases, or that there was nothing to run."""
    if result.candidate:
        return f"live checks: {sum(len(o.cases) for o in result.candidate)} case(s) passed"
    return "live checks: none to run (no patch in the image names a Live-Check); nothing was started"

