"""`vpatch new`: start a new patch in the applied tree."""

from __future__ import annotations

from pathlib import Path

from vpatch.base import ExitCode
from vpatch.commands import echo, load_config, load_series


def run(*, project: Path, slug: str, subject: str | None) -> ExitCode:
    from vpatch import git
    from vpatch.tree import newpatch

    config = load_config(project)
    with git.project_lock(config.root, "new"):
        name, tree = newpatch.start(load_series(config), config.state_dir, slug=slug, subject=subject)
    echo(f"started {name} as an empty commit in the applied tree {tree}")
    echo("next: make the change in that tree, then (keeping the message's trailers, filling or deleting the <...> ones):")
    echo(f"  git -C {tree} commit --amend -a")
    echo(f"  vpatch probe new {name[:4]} --kind files     # or --kind command; or delete the Probe: line")
    echo("  vpatch export")
    return ExitCode.OK
