"""`vpatch lock-probes`: refresh the probe venv's lock on purpose."""

from __future__ import annotations

from pathlib import Path

from vpatch.base import ExitCode
from vpatch.commands import echo, load_config
from vpatch.probes import LOCK_NAME, refresh_lock
from vpatch.report import change_lines


def run(*, project: Path, lock: Path | None) -> ExitCode:
    path = lock or load_config(project).patches_dir / "probes" / LOCK_NAME
    echo(f"resolving {path.name} with pip (nothing is installed)...", err=True)
    change = refresh_lock(path)
    lines = change_lines(change)
    for line in lines:
        echo(line)
    if not lines:
        echo(f"{path.name}: unchanged", err=True)
    return ExitCode.OK
