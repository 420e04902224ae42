"""`vpatch releases`: build or refresh the release history from PyPI sdists."""

from __future__ import annotations

from pathlib import Path

from vpatch.base import ExitCode, cache_dir
from vpatch.commands import echo, load_config
from vpatch.config import CONFIG_NAME, find_root
from vpatch.report import ProgressView, release_lines
from vpatch.upstream import history_path, list_releases, update_releases


def run(*, project: Path, versions: list[str], first: str | None, last: str | None, pre: bool,
        list_only: bool) -> ExitCode:
    root = find_root(project.resolve())
    pin = load_config(project).pin.ref if (root / CONFIG_NAME).is_file() else None
    if list_only:
        result = list_releases()
    else:

        with ProgressView() as view:
            result = update_releases(versions, first=first, last=last, pre=pre, pin=pin, report=view)
    if not result:
        echo(f"the release history is empty ({history_path(cache_dir())})", err=True)
        echo("hint: vpatch releases --from 0.28.0 --to 0.33.0", err=True)
        return ExitCode.OK
    for line in release_lines(result):
        echo(line)
    echo(f"release history: {history_path(cache_dir())}", err=True)
    return ExitCode.OK
