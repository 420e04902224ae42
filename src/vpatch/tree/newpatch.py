"""Start a new patch: an empty commit in the applied tree whose message is the header template."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from vpatch import git
from vpatch.base import GitError, VpatchError
from vpatch.series import TEMPLATE_BODY, Series
from vpatch.tree.stack import MARKER, load_stack

_SLUG = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def template(subject: str, filename: str, today: str) -> str:
    """The message of a new patch: DEP-3 style trailers for the user to fill in or delete."""
    return (
        f"{subject}\n\n"
        f"{TEMPLATE_BODY}\n\n"
        "Origin: vendor\n"
        "Bug: <upstream issue URL, or delete>\n"
        "Forwarded: no\n"
        "Upstream-PR: <number of the upstream pull request, or delete>\n"
        f"Probe: probes/{filename.removesuffix('.patch')}.yaml\n"
        f"Last-Update: {today}\n"
        f"{MARKER}: {filename}\n"
    )


def start_patch(series: Series, state_dir: Path, *, slug: str, subject: str | None = None) -> tuple[str, Path]:
    """Add an empty commit for a new patch on top of the applied tree; returns its file name and the tree."""
    if not _SLUG.match(slug):
        raise VpatchError(f"bad patch slug {slug!r}", hint="use lower-case letters, digits and dashes, e.g. fix-parser")
    stack = load_stack(state_dir)
    assert stack is not None
    if not git.is_repo(stack.worktree):
        raise VpatchError(f"the applied tree {stack.worktree} is missing", hint="vpatch apply first")
    in_tree = _tree_files(stack.worktree, stack.base)
    same = next((p.filename for p in series if p.slug == slug), None)
    where = f"{series.directory.name}/"
    if same is None:
        same = next((f for f in [*in_tree, *(a.file for a in stack.applied)] if f[5:] == f"{slug}.patch"), None)
        where = f"the applied tree {stack.worktree} (not exported yet)"
    if same is not None:
        raise VpatchError(f"a patch named {slug!r} exists already: {same}, in {where}",
                          hint="to change it, amend its commit in the applied tree (git rebase -i, or "
                               "git commit --amend when it is the last); or choose another name")
    taken = ({p.number for p in series} | set(series.retired)
             | {int(f[:4]) for f in [*in_tree, *(a.file for a in stack.applied)] if f[:4].isdigit()})
    name = f"{max(taken, default=0) + 1:04d}-{slug}.patch"
    today = dt.date.today().isoformat()
    try:
        git.commit_index(stack.worktree, template(subject or slug.replace("-", " "), name, today))  # as the user
    except GitError as exc:
        if "tell me who you are" not in exc.output:
            raise
        raise VpatchError("git does not know who you are: the new patch's author is you, and no git identity is "
                          "configured", hint='git config --global user.name "Your Name" && git config --global '
                          'user.email you@example.com (or without --global, in the applied tree only), then '
                          f"vpatch new {slug} again") from None
    return name, stack.worktree


def _tree_files(tree: Path, base: str) -> list[str]:
    """The files the applied tree's commits name in their Vpatch-File lines (`vpatch new` commits too)."""
    return [file for record in git.log_records(tree, base, "HEAD", grep=[f"{MARKER}: "])
            for file in re.findall(rf"^{MARKER}: (\S+)$", record.body, re.M)]
