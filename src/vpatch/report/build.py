"""How `vpatch build` shows an image it built or reused: its id, the strategy and why, each tag and its push.
(`build --plan`'s lines are the plan's own description: image/plan.py's `describe`.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vpatch.image import BuildResult


def built_lines(built: BuildResult) -> list[str]:
    verb = "reused" if built.reused else f"built in {built.seconds:.1f}s"
    lines = [f"{verb}: {built.image_id[:19]} ({built.plan.strategy.value}: {built.plan.reason})"]
    for tag in built.plan.tags:
        digest = built.pushed.get(tag)
        lines.append(f"  {tag}" + (f"  pushed {digest}" if digest else ""))
    return lines
