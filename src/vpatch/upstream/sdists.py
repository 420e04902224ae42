"""The sdist cache: each release's sdist, downloaded once from the index pip uses, hash-checked.

Layout: ``<cache>/sdists/<package>-<version>.tar.gz``; a download lands in a ``.download-*``
folder beside it and is renamed into place, so the cache never holds a partial file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.utils import InvalidSdistFilename, parse_sdist_filename
from packaging.version import InvalidVersion, Version

from vpatch.base import Event, Reporter, UpstreamError, cache_dir, silent
from vpatch.upstream.index import Index

# Downloads are network-bound and hold no build environment: a few at once fill the line
# without hurting the disk (the old pip route was limited to one, as each built torch).
PARALLEL_DOWNLOADS = 4
_PARTIAL_PREFIX = ".download-"

# A downloader puts the sdist of one version into a directory and returns its path.
Downloader = Callable[[str, Path, Reporter], Path]


def sdist_dir(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "sdists"


def subject(package: str, version: str) -> str:
    """How progress names one release's sdist."""
    return f"{package} {version}"


def cached(version: str, *, cache: Path | None = None, package: str = "vllm") -> Path | None:
    """The cached sdist whose version equals `version` (so "0.30" finds vllm-0.30.0.tar.gz)."""
    folder = sdist_dir(cache)
    exact = folder / f"{package}-{version}.tar.gz"
    if exact.is_file():
        return exact
    try:
        wanted = Version(version)
    except InvalidVersion:
        return None
    for path in sorted(folder.glob(f"{package}-*.tar.gz")) if folder.is_dir() else []:
        try:
            if parse_sdist_filename(path.name)[1] == wanted:
                return path
        except InvalidSdistFilename:
            continue
    return None


def cached_versions(cache: Path | None = None, *, package: str = "vllm") -> list[str]:
    """The versions the cache holds an sdist of, as their file names spell them."""
    folder = sdist_dir(cache)
    found = []
    for path in sorted(folder.glob(f"{package}-*.tar.gz")) if folder.is_dir() else []:
        try:
            name, _version = parse_sdist_filename(path.name)
        except InvalidSdistFilename:
            continue
        if name == package:
            found.append(path.name[len(package) + 1:-len(".tar.gz")])
    return found


def index_downloader(index: Index, package: str) -> Downloader:
    """Download from the index pip is configured with: its URL and hash, then urllib; nothing built."""

    def download(version: str, dest: Path, report: Reporter) -> Path:
        dist = index.sdist(package, version)
        out = dest / f"{package}-{version}.tar.gz"
        name = subject(package, version)

        def on_bytes(done: int, total: int | None) -> None:
            report(Event(name, "downloading", dist.filename, done=done, total=total))

        with out.open("wb") as fh:
            index.download(dist, fh, on_bytes)
        return out

    return download


def fetch_sdist(
    version: str,
    *,
    cache: Path | None = None,
    package: str = "vllm",
    downloader: Downloader | None = None,
    report: Reporter = silent,
) -> Path:
    """The cached sdist of `version`, downloading it first when the cache lacks it."""
    found = cached(version, cache=cache, package=package)
    if found is not None:
        return found
    target = sdist_dir(cache) / f"{package}-{version}.tar.gz"
    if downloader is None:
        downloader = index_downloader(Index(), package)
    target.parent.mkdir(parents=True, exist_ok=True)
    name = subject(package, version)
    started = time.monotonic()
    report(Event(name, "downloading"))
    # Download beside the cache and rename: the cache never holds a partial sdist.
    with tempfile.TemporaryDirectory(prefix=f"{_PARTIAL_PREFIX}{version}-", dir=target.parent) as tmp:
        try:
            got = downloader(version, Path(tmp), report)
        except UpstreamError:
            report(Event(name, "failed", final=True, seconds=time.monotonic() - started))
            raise
        if not got.is_file():
            raise UpstreamError(f"the download of {package} {version} produced no {target.name}",
                                hint="the index may offer a wheel only, or another name; check the index")
        got.replace(target)
    size = target.stat().st_size
    report(Event(name, "downloaded", f"{target.name} ({size / 1e6:.1f} MB)", done=size, total=size, final=True,
                 seconds=time.monotonic() - started))
    return target


def fetch_all(
    versions: Iterable[str],
    *,
    cache: Path | None = None,
    package: str = "vllm",
    downloader: Downloader | None = None,
    report: Reporter = silent,
    parallel: int = PARALLEL_DOWNLOADS,
) -> dict[str, Path]:
    """Every version's sdist (at most `parallel` downloads at once); one error naming every failure."""
    versions = list(versions)
    if downloader is None and any(cached(v, cache=cache, package=package) is None for v in versions):
        # One index client for all downloads: the project page is read once.
        downloader = index_downloader(Index(), package)

    def one(version: str) -> Path:
        return fetch_sdist(version, cache=cache, package=package, downloader=downloader, report=report)

    paths: dict[str, Path] = {}
    failures: list[str] = []
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for version, future in [(v, pool.submit(one, v)) for v in versions]:
            try:
                paths[version] = future.result()
            except UpstreamError as exc:
                failures.append(exc.message)
    if failures:
        raise UpstreamError("\n".join(failures), hint="fix the cause and run the command again;"
                                                      " sdists already downloaded stay cached")
    return paths


def remove_partial_downloads(cache: Path | None = None) -> list[Path]:
    """Delete what killed downloads left (``.download-*``); call it only while holding the releases lock."""
    folder = sdist_dir(cache)
    removed = []
    for path in sorted(folder.glob(f"{_PARTIAL_PREFIX}*")) if folder.is_dir() else []:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def copy_sdists(source: Path, cache: Path, versions: Iterable[str], *, package: str = "vllm") -> None:
    """Seed another cache with sdists from `source` by hard link (or copy), for offline builds."""
    dest = sdist_dir(cache)
    dest.mkdir(parents=True, exist_ok=True)
    for version in versions:
        src = cached(version, cache=source, package=package)
        if src is None:
            raise UpstreamError(f"{source} holds no sdist of {package} {version}")
        try:
            os.link(src, dest / src.name)
        except FileExistsError:
            pass
        except OSError:
            shutil.copyfile(src, dest / src.name)
