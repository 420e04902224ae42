"""`vpatch fetch`: create or update the upstream mirror."""

from __future__ import annotations

from pathlib import Path

from vpatch.base import ExitCode, VpatchError, cache_dir
from vpatch.commands import echo, load_config
from vpatch.report import ProgressView
from vpatch.upstream import fetch_mirror


def run(*, project: Path, blob_filter: str | None) -> ExitCode:
    config = load_config(project)
    if config.upstream.source == "releases":
        raise VpatchError("this project reads upstream from the release history, not a git mirror",
                          hint="vpatch releases refreshes the release history")
    with ProgressView() as view:
        path = fetch_mirror(cache_dir(), config.upstream.git, blob_filter=blob_filter, report=view)
    echo(f"mirror of {config.upstream.git} is up to date at {path}")
    return ExitCode.OK
