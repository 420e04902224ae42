"""Where upstream vLLM is read from: a bare git mirror or the release history built from PyPI."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vpatch.config import Config


def cache_dir() -> Path:
    """vpatch's cache root: $VPATCH_CACHE, else $XDG_CACHE_HOME/vpatch, else ~/.cache/vpatch."""
    explicit = os.environ.get("VPATCH_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "vpatch"


def history_path(cache: Path | None = None, package: str = "vllm") -> Path:
    """The bare repository holding the release history of `package` (built by upstream.releases)."""
    return (cache or cache_dir()) / "releases" / f"{package}.git"


def open_upstream(config: "Config") -> Path:
    """The bare repository that answers refs for this project; an error with a hint when it is missing."""
    from vpatch import git
    from vpatch.errors import VpatchError

    if config.upstream.source == "releases":
        path = history_path(cache_dir(), config.upstream.releases or "vllm")
        what, hint = "release history", "run `vpatch releases` to build it from PyPI"
    else:
        from vpatch.upstream.mirror import mirror_path

        path = mirror_path(cache_dir(), config.upstream.git)
        what, hint = f"mirror of {config.upstream.git}", "run `vpatch fetch` to create it"
    if not git.is_repo(path):
        raise VpatchError(f"the upstream {what} is not in the cache ({path})", hint=hint)
    return path


def resolve(repo: Path, ref: str, *, what: str = "ref") -> str:
    """The commit a ref names upstream, or an error naming the ref."""
    from vpatch import git
    from vpatch.errors import VpatchError

    commit = git.resolve_commit(repo, ref)
    if commit is None:
        raise VpatchError(
            f"unknown {what} {ref!r}: upstream has no such tag, branch or commit",
            hint="vpatch fetch (or vpatch releases) to update upstream; `git -C <cache repo> tag` lists what it has",
        )
    return commit
