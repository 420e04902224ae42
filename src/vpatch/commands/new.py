"""`vpatch new`: start a new patch in the applied tree."""

from __future__ import annotations

from pathlib import Path

from vpatch import git
from vpatch.base import ExitCode
from vpatch.commands import echo, load_config, load_series, warn_stopped_update
from vpatch.report import started_lines
from vpatch.tree import start_patch


def run(*, project: Path, slug: str, subject: str | None) -> ExitCode:
    config = load_config(project)
    warn_stopped_update(config)
    with git.project_lock(config.root, "new"):
        name, tree = start_patch(load_series(config), config.state_dir, slug=slug, subject=subject)
    for line in started_lines(name, tree):
        echo(line)
    return ExitCode.OK
