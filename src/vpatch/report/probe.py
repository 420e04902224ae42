"""How `vpatch probe check` and `vpatch probe new` show a probe: its answer on each side of the patch, and the
files a template wrote with what to do next."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vpatch.probes import Checked, Coverage, ProbeTarget, Regressions


def tree_lines(found: ProbeTarget, patches_folder: str) -> list[str]:
    """Which patches `probe check` read from the applied tree rather than the patches folder; empty for none."""
    if not found.from_tree:
        return []
    return [f"reading {', '.join(found.from_tree)} from the applied tree {found.tree} (its commits differ from "
            f"{patches_folder}/: not exported yet; `vpatch export` writes them)"]


def dirty_warning(found: ProbeTarget) -> str | None:
    """On stderr: uncommitted changes in the applied tree, which the check does not see."""
    if not found.dirty:
        return None
    return (f"warning: uncommitted changes in the applied tree are not checked: {', '.join(found.dirty[:5])}"
            " (commit them: git commit --amend -a)")


def checked_lines(checked: Checked, target: str) -> list[str]:
    """The probe's outcome on the base and on the base + the series up to `target`, each with its output."""
    lines = []
    result_of = checked.validation
    for side, result in ((f"on {checked.ref} ({checked.base[:12]})", result_of.base),
                         (f"on {checked.ref} + the series up to {target}", result_of.patched)):
        if result is None:
            lines.append(f"{checked.probe} {side}: not run (the other side errored, which decides already)")
            continue
        lines.append(f"{checked.probe} {side}: {result.outcome.value.upper()}"
                     + (" (from the cache)" if result.cached else f" in {result.seconds:.1f}s"))
        lines += [f"    {line}" for line in (result.detail or "(no output)").splitlines()]
    return lines


def coverage_lines(found: Coverage) -> list[str]:
    """Which hunks the probe proves: each hunk taken out alone, and what the probe then said."""
    lines = [f"coverage: {found.says()}"]
    for hunk in found.hunks:
        mark = {True: "covered", False: "NOT covered", None: "unknown"}[hunk.covered]
        lines.append(f"    {mark:<11} {hunk.hunk}: {hunk.detail}")
    return lines


def regression_lines(found: Regressions) -> list[str]:
    """Upstream's tests of the touched files without and with the patch, and what counts against it."""
    lines = [f"regressions: {found.says()}"]
    for side, run in (("without the patch", found.base), ("with the patch", found.patched)):
        if run is not None:
            lines.append(f"    {side}: {run.detail or 'no output'}" + (" (from the cache)" if run.cached else
                                                                       f" in {run.seconds:.1f}s"))
    lines += [f"    REGRESSION {test}" for test in found.regressed]
    lines += [f"    fails on both sides (upstream's): {test}" for test in found.upstreams]
    lines += [f"    not run here ({need}): {test}" for test, need in found.not_run_here]
    return lines


def written_lines(written: Sequence[Path], name: str, trailer: str, *, named: str | None) -> list[str]:
    """The files a probe template wrote, whether the patch names the probe yet (`named`: the patch file that
    does), and the next step."""
    lines = [f"wrote {path}" for path in written]
    if named is not None:
        lines.append(f"{named} already names it ({trailer})")
    else:
        lines.append(f"name it in the patch's trailers: {trailer} (in the applied tree: `git commit --amend`, then "
                     "`vpatch export`)")
    lines.append(f"edit it, then `vpatch probe check {name[:4]}`: it must fail on the pin and pass with the patch")
    return lines
