"""How `vpatch releases` shows the release history: one line per release, its commit, day and state."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vpatch.upstream import Release


def release_lines(releases: Sequence[Release]) -> list[str]:
    lines = []
    for r in releases:
        day = datetime.datetime.fromtimestamp(r.date, datetime.UTC).strftime("%Y-%m-%d")
        lines.append(f"{r.tag:<12} {r.commit[:12]}  {day}  {r.state.value}")
    return lines
