"""`vpatch releases`: build or refresh the release history from PyPI sdists."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vpatch.base import ExitCode, VpatchError, cache_dir
from vpatch.commands import echo, load_config, load_series
from vpatch.config import CONFIG_NAME, Config, find_root
from vpatch.probes import venvs_beside
from vpatch.report import ProgressView, release_lines
from vpatch.series import Patch
from vpatch.upstream import history_path, list_releases, update_releases


def run(*, project: Path, versions: list[str], first: str | None, last: str | None, pre: bool,
        list_only: bool) -> ExitCode:
    root = find_root(project.resolve())
    config = load_config(project) if (root / CONFIG_NAME).is_file() else None
    pin = config.pin.ref if config is not None else None
    if list_only:
        result = list_releases()
    else:
        # In a project, its probe venvs build beside the downloads: the first status then finds them ready.
        patches = _patches(config)
        with ProgressView(phases=True) as view, venvs_beside(patches, report=view):
            result = update_releases(versions, first=first, last=last, pre=pre, pin=pin, report=view)
    if not result:
        echo(f"the release history is empty ({history_path(cache_dir())})", err=True)
        echo("hint: vpatch releases --from 0.28.0 --to 0.33.0", err=True)
        return ExitCode.OK
    for line in release_lines(result):
        echo(line)
    echo(f"release history: {history_path(cache_dir())}", err=True)
    return ExitCode.OK


def _patches(config: Config | None) -> Sequence[Patch]:
    """The project's series, if there is one that loads (a broken one is for `status` to name, not `releases`)."""
    if config is None:
        return ()
    try:
        return load_series(config).patches
    except VpatchError:
        return ()
