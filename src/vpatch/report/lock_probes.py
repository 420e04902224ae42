"""How `vpatch lock-probes` shows what refreshing the probe venv's lock changed: moved, added, removed pins."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vpatch.probes import LockChange


def change_lines(change: LockChange) -> list[str]:
    """One line per pin that moved, was added or removed; empty when nothing changed."""
    return [*(f"{name} {old} -> {new}" for name, old, new in change.moved),
            *(f"+ {line}" for line in change.added),
            *(f"- {line}" for line in change.removed)]
