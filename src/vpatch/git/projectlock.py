"""The project lock: one file beside git's own state (or in .vpatch/ outside a repository), so update, apply,
export and new never run at the same time on one checkout. The lock itself is base.lock's `exclusive`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vpatch.base import exclusive
from vpatch.git.refs import git_dir, toplevel

PROJECT_LOCK = "vpatch.lock"


def project_lock_path(root: Path) -> Path:
    """The project's lock: beside git's own state when the project is in a repository, else in .vpatch/."""
    top = toplevel(root)
    return root / ".vpatch" / PROJECT_LOCK if top is None else git_dir(top) / PROJECT_LOCK


@contextmanager
def project_lock(root: Path, command: str) -> Iterator[None]:
    """The project lock for `vpatch <command>`: update (with --continue/--abort), apply, export and new
    never run at the same time on one checkout, so none deletes or writes over another's work."""
    with exclusive(project_lock_path(root), what=f"vpatch {command}", holder=f"vpatch {command}"):
        yield
