"""vLLM's release history as a git repository built from PyPI sdists: one commit per release.

The history is a pure function of the set of releases in it: same sdists, same commit SHAs on
every machine. Adding a release that sorts before existing ones rebuilds the chain after it (the
trees stay; only the commits above the new one get new parents), so the rule holds however the
history was grown.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from packaging.version import InvalidVersion, Version

from vpatch import git, process
from vpatch.errors import UpstreamError
from vpatch.upstream import cache_dir
from vpatch.upstream import history_path as history_path  # re-exported: where the history lives

PACKAGE = "vllm"
IDENTITY = "vpatch release history <releases@vpatch.invalid>"
BRANCH = "refs/heads/releases"
# fast-import needs a branch to commit on; the stream resets it at the end so it is never written.
_SCRATCH_REF = "refs/vpatch/release-build"
_TAG_PREFIX = "refs/tags/v"
# pip spends a download installing torch into a fresh build environment (vLLM's setup.py
# imports it), which is disk-bound: three at once took 130 s each against about 65 s alone.
PARALLEL_DOWNLOADS = 1
# Where a plain `vpatch releases` starts. A commit's SHA depends on every release below it, so
# histories only agree across machines when they share their oldest release: a fixed floor
# (not, say, each project's pin) keeps v0.29.0 the same commit everywhere.
DEFAULT_FIRST = "0.28.0"


class Stage(Enum):
    CACHED = "cached"  # the sdist was already in the cache
    DOWNLOADING = "downloading"  # a line of pip's output while it downloads
    DOWNLOADED = "downloaded"
    BUILDING = "building"  # turning the sdist into a commit


class State(Enum):
    PRESENT = "present"  # already in the history, untouched
    ADDED = "added"  # new commit from its sdist
    REWRITTEN = "rewritten"  # same tree, new parent: an older release was inserted below it


@dataclass(frozen=True)
class Progress:
    version: str
    stage: Stage
    detail: str = ""


ProgressFn = Callable[[Progress], None]
# A downloader puts the sdist of one version into a directory and returns its path.
Downloader = Callable[[str, Path, ProgressFn], Path]
# A lister returns every version of the package the index offers.
Lister = Callable[[], list[str]]


@dataclass(frozen=True)
class Release:
    version: str
    tag: str
    commit: str
    tree: str
    date: int  # seconds since the epoch, UTC: the newest member of the sdist
    state: State


@dataclass(frozen=True)
class _Sdist:
    package: str
    version: str
    path: Path


def sdist_dir(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "sdists"


def normalize(version: str) -> str:
    """"v0.30.0" or "0.30" -> the canonical "0.30.0"-style string packaging gives it."""
    text = version[1:] if version[:1] in ("v", "V") else version
    try:
        return str(Version(text))
    except InvalidVersion:
        raise UpstreamError(f"not a release version: {version!r}", hint="give versions like 0.30.0") from None


def _is_version(text: str) -> bool:
    try:
        normalize(text)
    except UpstreamError:
        return False
    return True


def _no_progress(_: Progress) -> None:
    pass


# --- sdists -------------------------------------------------------------------


def pip_download(version: str, dest: Path, progress: ProgressFn, *, package: str = PACKAGE) -> Path:
    """Download the sdist of `version` with pip into `dest`, compiling nothing.

    vLLM's build backend reads VLLM_TARGET_DEVICE=empty as "no extensions", so pip only runs
    its metadata step; VLLM_VERSION_OVERRIDE stands in for the git tag an sdist lacks.
    """
    env = {"VLLM_TARGET_DEVICE": "empty", "VLLM_VERSION_OVERRIDE": version}
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", package,
        "--progress-bar", "off", "-d", str(dest), f"{package}=={version}",
    ]

    def on_line(line: str) -> None:
        if line.strip():
            progress(Progress(version, Stage.DOWNLOADING, line.rstrip()))

    result = process.stream(cmd, on_line, env=env, check=False)
    if result.returncode != 0:
        raise UpstreamError(
            f"pip could not download the sdist of {package} {version} (exit code {result.returncode}):\n"
            + "\n".join(result.out.splitlines()[-15:]),
            hint=f"check the network and the index, or run: pip download --no-deps --no-binary {package} "
            f"{package}=={version}",
        )
    return dest / f"{package}-{version}.tar.gz"


def fetch_sdist(
    version: str,
    *,
    cache: Path | None = None,
    package: str = PACKAGE,
    downloader: Downloader | None = None,
    progress: ProgressFn = _no_progress,
) -> Path:
    """The cached sdist of `version`, downloading it first when the cache lacks it."""
    target = sdist_dir(cache) / f"{package}-{version}.tar.gz"
    downloader = downloader or functools.partial(pip_download, package=package)
    if target.is_file():
        progress(Progress(version, Stage.CACHED, str(target.name)))
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Download beside the cache and rename: the cache never holds a partial sdist.
    with tempfile.TemporaryDirectory(prefix=f".download-{version}-", dir=target.parent) as tmp:
        got = downloader(version, Path(tmp), progress)
        if not got.is_file():
            raise UpstreamError(
                f"the download of {package} {version} produced no {target.name}",
                hint="pip may have found a wheel or another name; check the index",
            )
        got.replace(target)
    progress(Progress(version, Stage.DOWNLOADED, f"{target.name} ({target.stat().st_size / 1e6:.1f} MB)"))
    return target


def pip_index_versions(package: str = PACKAGE) -> list[str]:
    """Every version of `package` the configured index offers (pip index versions)."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", "--pre", package]
    result = process.run(cmd, check=False)
    for line in result.out.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.partition(":")[2].split(",") if v.strip()]
    raise UpstreamError(
        f"could not list the versions of {package} on the index (pip exit code {result.returncode}):\n"
        + (result.err.strip() or result.out.strip()),
        hint="name the versions explicitly, e.g. vpatch releases 0.30.0 0.31.0",
    )


def select_versions(
    available: Iterable[str], *, first: str | None = None, last: str | None = None, pre: bool = False
) -> list[str]:
    """Versions in [first, last] (either end open), oldest first; final releases only unless `pre`."""
    chosen = []
    for text in available:
        try:
            v = Version(text)
        except InvalidVersion:
            continue
        if (v.is_prerelease or v.is_devrelease) and not pre:
            continue
        if first is not None and v < Version(normalize(first)):
            continue
        if last is not None and v > Version(normalize(last)):
            continue
        chosen.append(v)
    return [str(v) for v in sorted(set(chosen))]


# --- sdist -> fast-import stream -------------------------------------------------


def _is_generated(path: str) -> bool:
    """Files the sdist build adds that are not upstream source: PKG-INFO and *.egg-info/."""
    parts = path.split("/")
    return path == "PKG-INFO" or any(p.endswith(".egg-info") for p in parts)


def _quote(path: str) -> bytes:
    """A path as a C-style quoted fast-import string, safe for any byte."""
    out = bytearray(b'"')
    for byte in path.encode("utf-8", "surrogateescape"):
        if byte in (0x22, 0x5C):
            out += b"\\" + bytes([byte])
        elif 0x20 <= byte < 0x7F:
            out.append(byte)
        else:
            out += b"\\%03o" % byte
    out += b'"'
    return bytes(out)


def _data(payload: bytes) -> bytes:
    return b"data %d\n" % len(payload) + payload + b"\n"


@dataclass
class _Marks:
    next: int = 1

    def take(self) -> int:
        self.next += 1
        return self.next - 1


# setuptools-scm records the upstream commit in vllm/_version.py as commit_id = 'g<sha>'.
_UPSTREAM_RE = re.compile(rb"""commit_id\s*=\s*['"]g?([0-9a-f]{7,40})['"]""")


def _commit_header(mark: int, who: str, message: str, parent: str | None) -> bytes:
    # Reset first: a commit without `from` must be a root, not a child of the scratch branch.
    out = b"reset %s\ncommit %s\nmark :%d\n" % (_SCRATCH_REF.encode(), _SCRATCH_REF.encode(), mark)
    out += b"author %s\ncommitter %s\n" % (who.encode(), who.encode()) + _data(message.encode())
    return out + (b"from %s\n" % parent.encode() if parent else b"") + b"deleteall\n"


def _sdist_stream(sdist: _Sdist, parent: str | None, mark: int, marks: _Marks) -> Iterator[bytes]:
    """The blobs of one sdist, then its commit as mark `mark` on `parent` (a SHA or ":mark")."""
    top = f"{sdist.package}-{sdist.version}/"
    entries: list[tuple[str, bytes, int]] = []  # (path, mode, blob mark)
    upstream: str | None = None
    date = 0
    digest = hashlib.sha256()
    with sdist.path.open("rb") as raw:
        for chunk in iter(lambda: raw.read(1 << 20), b""):
            digest.update(chunk)
    try:
        with tarfile.open(sdist.path, "r:gz") as tar:
            for member in tar:
                date = max(date, int(member.mtime))
                name = member.name[2:] if member.name.startswith("./") else member.name
                if name.rstrip("/") == top.rstrip("/") and member.isdir():
                    continue
                if not name.startswith(top):
                    raise UpstreamError(
                        f"{sdist.path.name}: member {member.name!r} is outside the top folder {top!r}",
                        hint="the file is not a vLLM sdist; delete it from the cache and fetch again",
                    )
                path = name[len(top):].rstrip("/")
                if not path or member.isdir() or _is_generated(path):
                    continue
                if member.issym():
                    mode, payload = b"120000", member.linkname.encode("utf-8", "surrogateescape")
                elif member.isfile() or member.islnk():
                    extracted = tar.extractfile(member)
                    assert extracted is not None
                    payload = extracted.read()
                    mode = b"100755" if member.mode & 0o100 else b"100644"
                    if path == f"{sdist.package}/_version.py" and (found := _UPSTREAM_RE.search(payload)):
                        upstream = found.group(1).decode()
                else:
                    continue  # devices and fifos have no place in a source tree
                blob = marks.take()
                yield b"blob\nmark :%d\n" % blob + _data(payload)
                entries.append((path, mode, blob))
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise UpstreamError(
            f"cannot read {sdist.path}: {exc}", hint="delete it from the cache and fetch it again"
        ) from exc
    message = (
        f"{sdist.package} {sdist.version} (from PyPI sdist {sdist.path.name})\n\n"
        f"Sdist: {sdist.path.name}\nSdist-SHA256: {digest.hexdigest()}\n"
        + (f"Upstream-Commit: {upstream}\n" if upstream else "")
    )
    header = _commit_header(mark, f"{IDENTITY} {date} +0000", message, parent)
    yield header + b"".join(b"M %s :%d %s\n" % (mode, m, _quote(p)) for p, mode, m in entries) + b"\n"


def _rewrite_stream(repo: Path, commit: str, parent: str | None, mark: int) -> bytes:
    """A commit with the tree, identity, date and message of `commit` on a new parent."""
    old = git.read_commit(repo, commit)
    assert old.author == old.committer, f"{commit} was not made by vpatch"
    return _commit_header(mark, old.committer, old.message, parent) + b'M 040000 %s ""\n\n' % old.tree.encode()


def _date(commit: git.CommitObject) -> int:
    return int(commit.committer.rsplit(" ", 2)[1])


# --- the history ------------------------------------------------------------------


def _existing(repo: Path) -> dict[str, str]:
    """Version -> commit for every release tag in the history."""
    found: dict[str, str] = {}
    if not git.is_repo(repo):
        return found
    for ref, sha in git.ref_values(repo, "refs/tags/").items():
        if not ref.startswith(_TAG_PREFIX):
            continue
        try:
            version = str(Version(ref[len(_TAG_PREFIX):]))
        except InvalidVersion:
            continue
        found[version] = sha
    return found


def _sorted(versions: Iterable[str]) -> list[str]:
    return [str(v) for v in sorted({Version(v) for v in versions})]


def list_releases(cache: Path | None = None, *, package: str = PACKAGE) -> list[Release]:
    """The releases in the history, oldest first (an empty list when there is no history yet)."""
    repo = history_path(cache, package)
    existing = _existing(repo)
    releases = []
    for version in _sorted(existing):
        obj = git.read_commit(repo, existing[version])
        releases.append(Release(version, f"v{version}", existing[version], obj.tree, _date(obj), State.PRESENT))
    return releases


def build_history(
    versions: Iterable[str],
    *,
    cache: Path | None = None,
    package: str = PACKAGE,
    downloader: Downloader | None = None,
    progress: ProgressFn = _no_progress,
) -> list[Release]:
    """Make sure the history holds `versions` (plus what it held); returns every release, oldest first.

    All missing sdists are fetched before the repository is touched, and refs move in one
    transaction at the end: a failed download or an interrupted build leaves the history as it was.
    """
    repo = history_path(cache, package)
    existing = _existing(repo)
    wanted = _sorted([normalize(v) for v in versions] + list(existing))
    missing = [v for v in wanted if v not in existing]

    # Fetch everything before touching the repository; report every failed download at once.
    def fetch(version: str) -> _Sdist:
        return _Sdist(package, version, fetch_sdist(version, cache=cache, package=package, downloader=downloader,
                                                    progress=progress))

    sdists: dict[str, _Sdist] = {}
    failures: list[str] = []
    with ThreadPoolExecutor(max_workers=PARALLEL_DOWNLOADS) as pool:
        for version, future in [(v, pool.submit(fetch, v)) for v in missing]:
            try:
                sdists[version] = future.result()
            except UpstreamError as exc:
                failures.append(exc.message)
    if failures:
        raise UpstreamError(
            "\n".join(failures) + f"\nthe release history in {repo} is unchanged",
            hint="fix the cause and run the command again; sdists already downloaded stay cached",
        )

    if not git.is_repo(repo):
        git.init_bare(repo)
        git.set_head(repo, BRANCH)

    # Keep the longest prefix of the old chain whose parents still match; rebuild from there.
    plan: list[tuple[str, str | None]] = []  # (version, commit to keep or None)
    parent: str | None = None
    intact = True
    for version in wanted:
        sha = existing.get(version)
        if sha and intact and git.parents(repo, sha) == ([parent] if parent else []):
            plan.append((version, sha))
            parent = sha
        else:
            intact = False
            plan.append((version, None))

    results: dict[str, tuple[str, State]] = {}
    marks = _Marks()
    mark_of: dict[str, int] = {}

    def stream() -> Iterator[bytes]:
        prev: str | None = None
        for version, keep in plan:
            if keep:
                prev = keep
                continue
            mark_of[version] = mark = marks.take()
            if version in sdists:
                progress(Progress(version, Stage.BUILDING, sdists[version].path.name))
                yield from _sdist_stream(sdists[version], prev, mark, marks)
            else:
                yield _rewrite_stream(repo, existing[version], prev, mark)
            prev = f":{mark}"
        # Drop the scratch branch, so that fast-import writes no ref: tags move below, all at once.
        yield b"reset %s\n\ndone\n" % _SCRATCH_REF.encode()

    imported = git.fast_import(repo, stream()) if any(keep is None for _v, keep in plan) else {}

    updates: list[git.RefUpdate] = []
    for version, keep in plan:
        if keep:
            results[version] = (keep, State.PRESENT)
            continue
        sha = imported[f":{mark_of[version]}"]
        if sha == existing.get(version):
            results[version] = (sha, State.PRESENT)  # rebuilt to the very same commit
            continue
        results[version] = (sha, State.REWRITTEN if version in existing else State.ADDED)
        updates.append(git.RefUpdate(f"{_TAG_PREFIX}{version}", sha, existing.get(version, git.ZERO_SHA)))
    if updates:
        updates.append(git.RefUpdate(BRANCH, results[wanted[-1]][0]))
        git.update_refs(repo, updates)

    releases = []
    for version, (sha, state) in results.items():
        obj = git.read_commit(repo, sha)
        releases.append(Release(version, f"v{version}", sha, obj.tree, _date(obj), state))
    return releases


def ensure_history(
    versions: Iterable[str], *, cache: Path | None = None, package: str = PACKAGE, progress: ProgressFn = _no_progress
) -> Path:
    """The history repository, built first if it lacks any of `versions`."""
    wanted = {normalize(v) for v in versions}
    if not wanted <= set(_existing(history_path(cache, package))):
        build_history(sorted(wanted), cache=cache, package=package, progress=progress)
    return history_path(cache, package)


def copy_sdists(source: Path, cache: Path, versions: Iterable[str], *, package: str = PACKAGE) -> None:
    """Seed another cache with sdists from `source` by hard link (or copy), for offline builds."""
    dest = sdist_dir(cache)
    dest.mkdir(parents=True, exist_ok=True)
    for version in versions:
        name = f"{package}-{normalize(version)}.tar.gz"
        src = sdist_dir(source) / name
        try:
            os.link(src, dest / name)
        except OSError:
            shutil.copyfile(src, dest / name)


def update(
    versions: Sequence[str] = (),
    *,
    first: str | None = None,
    last: str | None = None,
    pre: bool = False,
    pin: str | None = None,
    cache: Path | None = None,
    package: str = PACKAGE,
    lister: Lister | None = None,
    downloader: Downloader | None = None,
    progress: ProgressFn = _no_progress,
) -> list[Release]:
    """Add `versions` and every release in [first, last] to the history; returns all it holds.

    With neither versions nor a range it refreshes: every release from DEFAULT_FIRST (or the
    oldest the history holds, or the project's `pin`, whichever is older) to the newest on the index.
    """
    wanted = [normalize(v) for v in versions]
    if not wanted and first is None and last is None:
        starts = [Version(DEFAULT_FIRST)] + [Version(r.version) for r in list_releases(cache, package=package)[:1]]
        if pin and _is_version(pin):
            starts.append(Version(normalize(pin)))
        first = str(min(starts))
    if first is not None or last is not None:
        offered = (lister or functools.partial(pip_index_versions, package))()
        in_range = select_versions(offered, first=first, last=last, pre=pre)
        if not in_range:
            raise UpstreamError(
                f"the index offers no {package} release between {first or 'the first'} and {last or 'the newest'}",
                hint="check --from/--to (pre-releases only with --pre)",
            )
        wanted += in_range
    if not wanted:
        return list_releases(cache, package=package)
    return build_history(wanted, cache=cache, package=package, downloader=downloader, progress=progress)
