"""One module per command (`commands/<cmd>.py`): each `run` takes explicit keyword arguments and returns
an exit code. With cli.py the entry layer: the only code that prints. What is shown comes from `report`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from vpatch.base import VpatchError
from vpatch.config import Config, find_root  # cli.py loads the config room already (Strategy)

if TYPE_CHECKING:
    from vpatch.series import Series


def echo(text: str = "", *, err: bool = False) -> None:
    typer.echo(text, err=err)


def progress(line: str) -> None:
    """A core step's progress line: on stderr, so stdout keeps only the result (scripts and --json read it)."""
    echo(line, err=True)


def console() -> Any:
    """A rich console; when output is not a terminal (CI logs, pipes) tables get room instead of 80 columns."""
    import os  # lazy: beside rich's, which loads only when something is shown

    from rich.console import Console  # lazy: rich loads only when something is shown; --help shows no table

    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS") or 160)
    return Console(soft_wrap=False, width=width)


def load_config(project: Path) -> Config:
    from vpatch.series import stray_files  # lazy: this package loads with every --help; the series with a command

    config = Config.load(find_root(project.resolve()))
    stray = stray_files(config.patches_dir)
    if stray:
        echo(f"warning: ignored in {config.patches}/ (only NNNN-slug.patch files are the series): {', '.join(stray)}",
             err=True)
    return config


def load_series(config: Config) -> Series:
    from vpatch.series import Series  # lazy: this package loads with every --help; the series with a command

    return Series.load(config.patches_dir)


def warn_tree_work(config: Config, what: str) -> None:
    """One line on stderr when the applied tree holds work `patches/` lacks: `what` (a check that reads the
    files) does not see it. Nothing when there is no tree, or the series does not load (the check says why)."""
    from vpatch.series import Series  # lazy: this package loads with every --help; the series with a command
    from vpatch.tree import tree_work  # lazy: the tree room (git, upstream) only for a command that reads the tree

    try:
        work = tree_work(Series.load(config.patches_dir), config.state_dir)
    except VpatchError:
        return
    if work is not None:
        echo(f"warning: {what} reads {config.patches}/, not the applied tree's work not exported yet: "
             f"{work.describe()}; `vpatch export` first to include it", err=True)


def stopped_update(config: Config) -> Any:
    """The update this project is stopped in (`update.Stopped`), or None: every command says so."""
    from vpatch.update import stopped_update as find  # lazy: the update room only for a command that runs

    return find(config)


def warn_stopped_update(config: Config) -> None:
    """One line on stderr while an update is stopped: what a command does now does not finish it."""
    stopped = stopped_update(config)
    if stopped is not None:
        echo(f"note: {stopped.line()}", err=True)
