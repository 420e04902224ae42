"""`vpatch apply`: a work tree of the pin (or a ref) with each patch as one commit."""

from __future__ import annotations

from pathlib import Path

from vpatch import git, upstream
from vpatch.base import ExitCode
from vpatch.commands import echo, load_config, load_series, warn_stopped_update
from vpatch.report import applied_lines, moved_pin_warning
from vpatch.tree import apply_series


def run(*, project: Path, ref: str | None, out: Path | None, keep: bool, force: bool) -> ExitCode:
    config = load_config(project)
    warn_stopped_update(config)
    series = load_series(config)
    repo = upstream.open_upstream(config)
    target = ref or config.pin.ref
    pinned = upstream.pin_commit(repo, config, moved_ok=True)
    base = pinned if ref is None else upstream.resolve(repo, target)
    if ref is None and upstream.pin_moved(repo, config):
        echo(moved_pin_warning(config.pin.ref, pinned), err=True)
    with git.project_lock(config.root, "apply"):
        # onto another ref, files upstream moved since the pin are followed (docs/moves.md)
        pin = pinned if ref is not None else None
        result = apply_series(repo, series, ref=target, base=base, out=out or config.state_dir / "tree",
                                    state_dir=config.state_dir, keep=keep, force=force, moves_from=pin)
    for line in applied_lines(result, target, base):
        echo(line)
    return ExitCode.OK
