"""`vpatch export`: the applied tree's commits back to the numbered patch files."""

from __future__ import annotations

from pathlib import Path

from vpatch import git
from vpatch.base import ExitCode
from vpatch.commands import echo, load_config, warn_stopped_update
from vpatch.report import export_lines
from vpatch.series import Series
from vpatch.tree import export_series


def run(*, project: Path, dry_run: bool, force: bool = False) -> ExitCode:
    config = load_config(project)
    warn_stopped_update(config)
    with git.project_lock(config.root, "export"):
        # a file whose diff no longer parses (a hand-edited hunk) is written afresh from its commit in the tree
        series = Series.load(config.patches_dir, unreadable_ok=True)
        result = export_series(series, config.state_dir, dry_run=dry_run, force=force)
    unreadable = {name: error.message for name, error in series.unreadable}
    for line in export_lines(result, dry_run=dry_run, unreadable=unreadable):
        echo(line)
    return ExitCode.OK
