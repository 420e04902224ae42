"""How `vpatch apply` shows the applied tree: the ref it stands on, one line per patch commit, what to do next."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vpatch.tree import Stack


def applied_lines(result: Stack, target: str, base: str) -> list[str]:
    return [f"applied {len(result.applied)} patch(es) onto {target} ({base[:12]}) in {result.worktree}",
            *(f"  {a.commit[:12]} {a.file}" for a in result.applied),
            "edit the commits there (amend, add a commit for a new patch), then run `vpatch export`"]


def moved_pin_warning(ref: str, recorded: str) -> str:
    """The pin's ref names another commit upstream now (a moved tag): the recorded commit is what is applied."""
    return f"warning: {ref} now names another commit upstream; applying onto the recorded {recorded[:12]}"
