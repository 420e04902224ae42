"""Start a new patch: an empty commit in the applied tree whose message is the header template."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from vpatch import git
from vpatch.errors import VpatchError
from vpatch.series import Series
from vpatch.stack import MARKER, load_stack

_SLUG = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def template(subject: str, filename: str, today: str) -> str:
    """The message of a new patch: DEP-3 style trailers for the user to fill in or delete."""
    return (
        f"{subject}\n\n"
        "Describe the problem, the change, and how it was verified.\n\n"
        "Origin: vendor\n"
        "Bug: <upstream issue URL, or delete>\n"
        "Forwarded: no\n"
        "Upstream-PR: <number of the upstream pull request, or delete>\n"
        f"Probe: probes/{filename.removesuffix('.patch')}.yaml\n"
        f"Last-Update: {today}\n"
        f"{MARKER}: {filename}\n"
    )


def start(series: Series, state_dir: Path, *, slug: str, subject: str | None = None) -> tuple[str, Path]:
    """Add an empty commit for a new patch on top of the applied tree; returns its file name and the tree."""
    if not _SLUG.match(slug):
        raise VpatchError(f"bad patch slug {slug!r}", hint="use lower-case letters, digits and dashes, e.g. fix-parser")
    stack = load_stack(state_dir)
    assert stack is not None
    if not git.is_repo(stack.worktree):
        raise VpatchError(f"the applied tree {stack.worktree} is missing", hint="vpatch apply first")
    taken = {p.number for p in series} | set(series.retired) | {int(a.file[:4]) for a in stack.applied if a.file[:4].isdigit()}
    name = f"{max(taken, default=0) + 1:04d}-{slug}.patch"
    today = dt.date.today().isoformat()
    git.commit_index(stack.worktree, template(subject or slug.replace("-", " "), name, today))  # as the user
    return name, stack.worktree
