"""How `vpatch new` shows the patch it started and the steps that make it one."""

from __future__ import annotations

from pathlib import Path


def started_lines(name: str, tree: Path) -> list[str]:
    return [f"started {name} as an empty commit in the applied tree {tree}",
            "next: make the change in that tree, then (keeping the message's trailers, filling or deleting the <...> "
            "ones):",
            f"  git -C {tree} commit --amend -a",
            f"  vpatch probe new {name[:4]} --kind files     # or --kind command; or delete the Probe: line",
            "  vpatch export"]
