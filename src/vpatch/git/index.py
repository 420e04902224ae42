"""Temporary indexes: trees built and patches applied without a checkout."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from vpatch.git.core import ZERO_SHA, Result, run
from vpatch.git.objects import hash_object, ls_tree
from vpatch.git.refs import git_dir


@contextmanager
def temp_index(repo: Path, folder: Path | None = None) -> Iterator[dict[str, str]]:
    """An environment whose GIT_INDEX_FILE is a fresh, throwaway index file, in `folder` (default: TMPDIR)."""
    fd, name = tempfile.mkstemp(prefix="vpatch-index-", dir=folder)
    os.close(fd)
    os.unlink(name)  # git wants to create it itself
    try:
        yield {"GIT_INDEX_FILE": name}
    finally:
        for suffix in ("", ".lock"):
            try:
                os.unlink(name + suffix)
            except FileNotFoundError:
                pass


def load_index(repo: Path, env: Mapping[str, str], treeish: str, paths: Sequence[str] | None = None) -> None:
    """Fill a temporary index with `treeish`, or only with `paths` of it (the rest left out)."""
    if paths is None:
        run(repo, ["read-tree", treeish], env=env)
        return
    add_index_entries(repo, env, [(mode, sha, path) for mode, kind, sha, path in ls_tree(repo, treeish, paths)
                                  if kind == "blob"])


def add_index_entries(repo: Path, env: Mapping[str, str], entries: Iterable[tuple[str, str, str]]) -> None:
    """Set (mode, object id, path) entries in a temporary index; mode "0" with ZERO_SHA removes the path."""
    info = "".join(f"{mode} {sha}\t{path}\n" for mode, sha, path in entries)
    if info:
        run(repo, ["update-index", "--index-info"], input=info.encode(), env=env)


def apply_cached(
    repo: Path, env: Mapping[str, str], patch: bytes, *, reverse: bool = False, check: bool = True,
    three_way: bool = False,
) -> Result:
    """`git apply --cached` against a temporary index; returns the result without raising."""
    args = ["apply", "--cached", "--verbose"]
    if check:
        args.append("--check")
    if reverse:
        args.append("--reverse")
    if three_way:
        args.append("--3way")
    return run(repo, args, input=patch, env=env, check=False)


def write_tree(repo: Path, env: Mapping[str, str]) -> str:
    return run(repo, ["write-tree"], env=env).out.strip()


def tree_with_patch(repo: Path, treeish: str, patch: bytes) -> str | None:
    """The tree `treeish` becomes with `patch` applied (no checkout), or None when it does not apply."""
    with temp_index(repo) as env:
        load_index(repo, env, treeish)
        if apply_cached(repo, env, patch, check=False).returncode != 0:
            return None
        return write_tree(repo, env)


def tree_with(repo: Path, base: str, writes: Mapping[str, bytes], removes: Iterable[str]) -> str:
    """The tree of `base` with `writes` (path -> content, mode 100644) added or replaced and `removes` gone."""
    with temp_index(repo) as env:
        run(repo, ["read-tree", base], env=env)
        add_index_entries(repo, env, [*(("100644", hash_object(repo, data), path) for path, data in writes.items()),
                                      *(("0", ZERO_SHA, path) for path in removes)])
        return write_tree(repo, env)


def worktree_tree(worktree: Path) -> str:
    """The tree a work tree's files make, as `git add -A` would stage them (conflicted paths as their files hold
    them), written without touching the work tree's own index."""
    index = git_dir(worktree) / "index"
    with temp_index(worktree) as env:
        if index.is_file():
            shutil.copyfile(index, env["GIT_INDEX_FILE"])  # its stat data: only the changed files are read
        run(worktree, ["add", "-A"], env=env)
        return write_tree(worktree, env)
