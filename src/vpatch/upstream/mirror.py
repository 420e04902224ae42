"""A bare git mirror of the upstream remote, kept in the cache and read through the object database."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from vpatch import git
from vpatch.errors import VpatchError


def mirror_path(cache: Path, url: str) -> Path:
    """One mirror per URL: a readable name plus a short hash so two URLs never share a folder."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "-", url.rstrip("/").rsplit("/", 1)[-1]).removesuffix(".git") or "upstream"
    digest = hashlib.sha256(url.encode()).hexdigest()[:10]
    return cache / "mirrors" / f"{tail}-{digest}.git"


def fetch(cache: Path, url: str) -> Path:
    """Create the mirror on first use, then fetch every branch and tag; returns its path."""
    path = mirror_path(cache, url)
    if not git.is_repo(path):
        tmp = path.with_name(path.name + ".partial")
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp)
        git.init_bare(tmp)
        git.run(tmp, ["remote", "add", "--mirror=fetch", "origin", url])
        _fetch(tmp, url)
        tmp.rename(path)  # only a complete first fetch becomes the mirror
        return path
    _fetch(path, url)
    return path


def _fetch(path: Path, url: str) -> None:
    result = git.run(path, ["fetch", "--prune", "--tags", "origin"], check=False)
    if result.returncode != 0:
        raise VpatchError(
            f"cannot fetch upstream {url}:\n{result.err.strip()}",
            hint="check the network and upstream.git in vpatch.yaml; without GitHub access use "
            "upstream.source: releases (the release history built from PyPI)",
        )
