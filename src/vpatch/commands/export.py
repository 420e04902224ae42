"""`vpatch export`: the applied tree's commits back to the numbered patch files."""

from __future__ import annotations

from pathlib import Path

from vpatch.base import ExitCode
from vpatch.commands import echo, load_config


def run(*, project: Path, dry_run: bool, force: bool = False) -> ExitCode:
    from vpatch import git
    from vpatch.series import Series
    from vpatch.tree import export

    config = load_config(project)
    with git.project_lock(config.root, "export"):
        # a file whose diff no longer parses (a hand-edited hunk) is written afresh from its commit in the tree
        series = Series.load(config.patches_dir, unreadable_ok=True)
        result = export.export_series(series, config.state_dir, dry_run=dry_run, force=force)
    for planned, done, names in (("would change", "changed", result.changed), ("would add", "added", result.added),
                                 ("would remove", "removed", result.removed)):
        for name in names:
            echo(f"{planned if dry_run else done}: {name}")
            if name in result.rewritten:
                echo(f"  {'' if dry_run else 'it '}did not parse ({dict(series.unreadable)[name].message}); "
                     "written afresh from its commit in the applied tree")
            if name in result.unmarked:
                echo("  note: a new patch, from a commit without a Vpatch-File line (a plain `git commit` in the "
                     "tree); to change an existing patch instead, fold it into that commit (git rebase -i, "
                     "fixup) or use `git commit --amend`, then export again (the new file goes)")
    if not (result.changed or result.added or result.removed):
        echo(f"nothing to export: {len(result.unchanged)} patch(es) unchanged")
    return ExitCode.OK
