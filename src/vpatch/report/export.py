"""How `vpatch export` shows what it wrote (or, --dry-run, would write) back to the patch files."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vpatch.tree import ExportResult


def export_lines(result: ExportResult, *, dry_run: bool, unreadable: Mapping[str, str]) -> list[str]:
    """One line per file changed, added or removed, with why where it says more; or that nothing changed.
    `unreadable`: why each patch file that did not parse did not (it was written afresh from its commit)."""
    lines = []
    for planned, done, names in (("would change", "changed", result.changed), ("would add", "added", result.added),
                                 ("would remove", "removed", result.removed)):
        for name in names:
            lines.append(f"{planned if dry_run else done}: {name}")
            if name in result.rewritten:
                lines.append(f"  {'' if dry_run else 'it '}did not parse ({unreadable[name]}); "
                             "written afresh from its commit in the applied tree")
            if name in result.unmarked:
                lines.append("  note: a new patch, from a commit without a Vpatch-File line (a plain `git commit` in "
                             "the tree); to change an existing patch instead, fold it into that commit (git rebase "
                             "-i, fixup) or use `git commit --amend`, then export again (the new file goes)")
    if not (result.changed or result.added or result.removed):
        lines.append(f"nothing to export: {len(result.unchanged)} patch(es) unchanged")
    return lines
