"""`vpatch lock-probes`: refresh the probe venv's lock on purpose."""

from __future__ import annotations

from pathlib import Path

from vpatch.base import ExitCode
from vpatch.commands import echo, load_config


def run(*, project: Path, lock: Path | None) -> ExitCode:
    from vpatch.probes import env as probe_env

    path = lock or load_config(project).patches_dir / "probes" / probe_env.LOCK_NAME
    echo(f"resolving {path.name} with pip (nothing is installed)...", err=True)
    change = probe_env.refresh_lock(path)
    for name, old, new in change.moved:
        echo(f"{name} {old} -> {new}")
    for line in change.added:
        echo(f"+ {line}")
    for line in change.removed:
        echo(f"- {line}")
    if not (change.moved or change.added or change.removed):
        echo(f"{path.name}: unchanged", err=True)
    return ExitCode.OK
