"""A bare git mirror of the upstream remote, kept in the cache and read through the object database.

A partial mirror (`blob_filter="blob:none"`) holds every commit and tree but fetches a file's content from
upstream the first time something reads it (git's partial clone): status reads the patches' files at each
target and bisection step and the diffs of the commits that touch them, a small part of vLLM's 1.1 GB. Reading
a blob not yet fetched needs upstream reachable. `prefetch` fetches the blobs a status will read in one request
before it reads them (upstream/prefetch.py says which).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from vpatch import git
from vpatch.base import Event, Reporter, VpatchError, silent

FILTERS = ("blob:none",)
_PHASE = re.compile(r"^(?:remote: )?([A-Za-z][A-Za-z ]+?):\s+(.*)$")


def mirror_path(cache: Path, url: str) -> Path:
    """One mirror per URL: a readable name plus a short hash so two URLs never share a folder."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "-", url.rstrip("/").rsplit("/", 1)[-1]).removesuffix(".git") or "upstream"
    digest = hashlib.sha256(url.encode()).hexdigest()[:10]
    return cache / "mirrors" / f"{tail}-{digest}.git"


def fetch(cache: Path, url: str, *, blob_filter: str | None = None, report: Reporter = silent) -> Path:
    """Create the mirror on first use (partial with `blob_filter`), then fetch every branch and tag; returns
    its path. `report` hears git's own progress counters. An existing mirror keeps the kind it was made as."""
    if blob_filter is not None and blob_filter not in FILTERS:
        raise VpatchError(f"unsupported mirror filter {blob_filter!r}",
                          hint=f"use --filter={FILTERS[0]} (a partial mirror) or no filter (a full one)")
    path = mirror_path(cache, url)
    if not git.is_repo(path):
        tmp = path.with_name(path.name + ".partial")
        if tmp.exists():

            shutil.rmtree(tmp)
        git.init_bare(tmp)
        git.add_mirror_remote(tmp, url)
        _fetch(tmp, url, blob_filter, report)
        tmp.rename(path)  # only a complete first fetch becomes the mirror
        return path
    _fetch(path, url, git.partial_filter(path), report)
    return path


def prefetch(path: Path, blobs: Sequence[str], *, report: Reporter = silent) -> None:
    """Fetch `blobs` (ids a partial mirror lacks) from upstream in one request, before they are read: git would
    fetch each one alone, a round trip to upstream per blob, when something first reads it."""
    blob_filter = git.partial_filter(path) if blobs else None
    if blob_filter is not None:
        _prefetch(path, blobs, blob_filter, report)


def prefetch_tree(path: Path, tree: str, *, report: Reporter = silent) -> None:
    """Every file of `tree` (a commit or tree id) a partial mirror lacks, in one request: a checkout of it (a probe
    runs in one) would fetch them one by one."""
    blob_filter = git.partial_filter(path)
    if blob_filter is not None:
        _prefetch(path, git.missing_blobs(path, [tree], None), blob_filter, report)


def _prefetch(path: Path, blobs: Sequence[str], blob_filter: str, report: Reporter) -> None:
    if not blobs:
        return
    subject = f"prefetching {len(blobs)} blob{'s' if len(blobs) != 1 else ''}"
    start = time.monotonic()
    errors: list[str] = []
    report(Event(subject, "fetching from upstream"))
    result = git.fetch_blobs(path, blobs, _progress(subject, report, errors), blob_filter=blob_filter)
    report(Event(subject, "done" if result.returncode == 0 else "failed", final=True, seconds=time.monotonic() - start))
    if result.returncode != 0:
        raise VpatchError(
            f"cannot fetch {len(blobs)} file contents from upstream into the partial mirror {path.name}:\n"
            f"{chr(10).join(errors[-20:]) or result.out.strip()}",
            hint="a partial mirror (vpatch fetch --filter=blob:none) reads upstream for files it has not read "
            "before: check the network, or make a full mirror (remove the mirror folder, then vpatch fetch)",
        )


def _progress(subject: str, report: Reporter, errors: list[str]) -> Callable[[str], None]:
    """A reader of git's progress lines: each phase's counters become events, anything else is kept in `errors`."""

    def progress(line: str) -> None:
        found = _PHASE.match(line.strip())
        if found and not found.group(1).lower().startswith(("fatal", "error", "warning")):
            phase, counters = found.group(1).lower(), found.group(2)
            if counters.endswith(", done."):  # the phase's last count: its own step, so a quiet view shows it too
                phase, counters = f"{phase}, done", counters.removesuffix(", done.")
            report(Event(subject, phase, counters))
        elif line.strip():
            errors.append(line)

    return progress


def _fetch(path: Path, url: str, blob_filter: str | None, report: Reporter) -> None:
    subject = f"fetch {url.rstrip('/').rsplit('/', 1)[-1]}" + (f" ({blob_filter})" if blob_filter else "")
    start = time.monotonic()
    errors: list[str] = []
    result = git.fetch_mirror(path, _progress(subject, report, errors), blob_filter=blob_filter)
    if result.returncode == 0:
        report(Event(subject, "writing the commit-graph"))
        git.write_commit_graph(path)
    report(Event(subject, "done" if result.returncode == 0 else "failed", final=True, seconds=time.monotonic() - start))
    if result.returncode != 0:
        raise VpatchError(
            f"cannot fetch upstream {url}:\n{chr(10).join(errors[-20:]) or result.out.strip()}",
            hint="check the network and upstream.git in vpatch.yaml; without GitHub access use "
            "upstream.source: releases (the release history built from PyPI)",
        )
