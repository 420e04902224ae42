"""vLLM's release history as a git repository built from PyPI sdists: one commit per release.

The history is a pure function of the set of releases in it: same sdists, same commit SHAs on
every machine. Adding a release that sorts before existing ones rebuilds the chain after it (the
trees stay; only the commits above the new one get new parents), so the rule holds however the
history was grown. The sdists come from upstream.sdists, their commits from upstream.stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from packaging.version import InvalidVersion, Version

from vpatch import git
from vpatch.base import Event, Reporter, UpstreamError, cache_dir, exclusive, silent
from vpatch.upstream import sdists
from vpatch.upstream.index import Index
from vpatch.upstream.sdists import Downloader
from vpatch.upstream.source import history_path as history_path  # noqa: PLC0414 (re-exported: where the history lives)
from vpatch.upstream.stream import IDENTITY as IDENTITY  # noqa: PLC0414 (re-exported: who made each commit)
from vpatch.upstream.stream import (
    SCRATCH_REF,
    Marks,
    Sdist,
    rewrite_stream,
    sdist_stream,
)

PACKAGE = "vllm"
BRANCH = "refs/heads/releases"
_TAG_PREFIX = "refs/tags/v"
# Where a plain `vpatch releases` starts. A commit's SHA depends on every release below it, so
# histories only agree across machines when they share their oldest release: a fixed floor
# (not, say, each project's pin) keeps v0.29.0 the same commit everywhere.
DEFAULT_FIRST = "0.28.0"

# A lister returns every version of the package the index offers an sdist of.
Lister = Callable[[], list[str]]


class ReleaseState(Enum):
    PRESENT = "present"  # already in the history, untouched
    ADDED = "added"  # new commit from its sdist
    REWRITTEN = "rewritten"  # same tree, new parent: an older release was inserted below it


@dataclass(frozen=True)
class Release:
    version: str
    tag: str
    commit: str
    tree: str
    date: int  # seconds since the epoch, UTC: the newest member of the sdist
    state: ReleaseState


def lock_path(cache: Path | None = None) -> Path:
    """The cache-level lock that one `vpatch releases` (or history build) holds at a time."""
    return (cache or cache_dir()) / "releases.lock"


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


def _same_as(version: str, known: Iterable[str]) -> str:
    """The name a release already has, when `version` is the same release spelt otherwise ("0.30" = "0.30.0")."""
    wanted = Version(version)
    for name in known:
        if Version(name) == wanted:
            return name
    return version


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
        releases.append(Release(version, f"v{version}", existing[version], obj.tree, _date(obj), ReleaseState.PRESENT))
    return releases


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


def index_versions(index: Index, package: str = PACKAGE) -> list[str]:
    """Every version the index offers an sdist of, yanked ones left out (as pip leaves them out)."""
    return [str(v) for v, dist in index.sdists(package).items() if not dist.yanked]


def build_history(
    versions: Iterable[str],
    *,
    cache: Path | None = None,
    package: str = PACKAGE,
    downloader: Downloader | None = None,
    index: Index | None = None,
    report: Reporter = silent,
) -> list[Release]:
    """Make sure the history holds `versions` (plus what it held); returns every release, oldest first.

    All missing sdists are fetched before the repository is touched, and refs move in one
    transaction at the end: a failed download or an interrupted build leaves the history as it was.
    One build runs at a time per cache (LockedError names the other one's pid).
    """
    with exclusive(lock_path(cache), what="vpatch releases"):
        # Under the lock, what a killed run left half-downloaded is nobody's live work.
        sdists.remove_partial_downloads(cache)
        return _build_locked(versions, cache=cache, package=package, downloader=downloader, index=index,
                             report=report)


def _build_locked(versions: Iterable[str], *, cache: Path | None, package: str, downloader: Downloader | None,
                  index: Index | None, report: Reporter) -> list[Release]:
    repo = history_path(cache, package)
    existing = _existing(repo)
    names, downloader = _names(versions, existing, cache=cache, package=package, downloader=downloader, index=index)
    wanted = _sorted(names + list(existing))
    missing = [v for v in wanted if v not in existing]

    # Fetch everything before touching the repository; report every failed download at once.
    try:
        paths = sdists.fetch_all(missing, cache=cache, package=package, downloader=downloader, report=report)
    except UpstreamError as exc:
        raise UpstreamError(exc.message + f"\nthe release history in {repo} is unchanged", hint=exc.hint) from None
    found = {v: Sdist(package, v, path) for v, path in paths.items()}

    if not git.is_repo(repo):
        git.init_bare(repo)
        git.set_head(repo, BRANCH)

    plan = _kept_prefix(repo, wanted, existing)
    results: dict[str, tuple[str, ReleaseState]] = {}
    marks = Marks()
    mark_of: dict[str, int] = {}

    def stream() -> Iterator[bytes]:
        prev: str | None = None
        for version, keep in plan:
            if keep:
                prev = keep
                continue
            mark_of[version] = mark = marks.take()
            if version in found:
                report(Event(sdists.subject(package, version), "building", found[version].path.name))
                yield from sdist_stream(found[version], prev, mark, marks)
            else:
                yield rewrite_stream(repo, existing[version], prev, mark)
            prev = f":{mark}"
        # Drop the scratch branch, so that fast-import writes no ref: tags move below, all at once.
        yield b"reset %s\n\ndone\n" % SCRATCH_REF.encode()

    imported = git.fast_import(repo, stream()) if any(keep is None for _v, keep in plan) else {}

    for version in mark_of:
        report(Event(sdists.subject(package, version), "committed", final=True))
    updates: list[git.RefUpdate] = []
    for version, keep in plan:
        if keep:
            results[version] = (keep, ReleaseState.PRESENT)
            continue
        sha = imported[f":{mark_of[version]}"]
        if sha == existing.get(version):
            results[version] = (sha, ReleaseState.PRESENT)  # rebuilt to the very same commit
            continue
        results[version] = (sha, ReleaseState.REWRITTEN if version in existing else ReleaseState.ADDED)
        updates.append(git.RefUpdate(f"{_TAG_PREFIX}{version}", sha, existing.get(version, git.ZERO_SHA)))
    if updates:
        updates.append(git.RefUpdate(BRANCH, results[wanted[-1]][0]))
        git.update_refs(repo, updates)

    releases = []
    for version, (sha, state) in results.items():
        obj = git.read_commit(repo, sha)
        releases.append(Release(version, f"v{version}", sha, obj.tree, _date(obj), state))
    return releases



def _names(versions: Iterable[str], existing: Mapping[str, str], *, cache: Path | None, package: str,
           downloader: Downloader | None, index: Index | None) -> tuple[list[str], Downloader | None]:
    """The releases asked for under one name each, and the downloader (the index's when one must be fetched)."""
    # "0.30" is the release the history or the index calls "0.30.0": one name per release, or the
    # same sdist would be fetched and committed under a second name.
    held = [*existing, *sdists.cached_versions(cache, package=package)]
    names = [_same_as(normalize(v), held) for v in versions]
    if downloader is None and any(v not in held for v in names):
        index = index or Index()
        downloader = sdists.index_downloader(index, package)
        offered = index_versions(index, package)
        names = [v if v in held else _same_as(v, offered) for v in names]
    return names, downloader


def _kept_prefix(repo: Path, wanted: Sequence[str], existing: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """(version, the commit to keep, or None to build it): the longest prefix of the old chain whose parents
    still match is kept; everything from there is rebuilt."""
    plan: list[tuple[str, str | None]] = []
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
    return plan


def ensure_history(
    versions: Iterable[str], *, cache: Path | None = None, package: str = PACKAGE, report: Reporter = silent
) -> Path:
    """The history repository, built first if it lacks any of `versions`."""
    existing = [Version(v) for v in _existing(history_path(cache, package))]
    if any(Version(normalize(v)) not in existing for v in versions):
        build_history(versions, cache=cache, package=package, report=report)
    return history_path(cache, package)


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
    report: Reporter = silent,
) -> list[Release]:
    """Add `versions` and every release in [first, last] to the history; returns all it holds.

    With neither versions nor a range it refreshes: every release from DEFAULT_FIRST (or the
    oldest the history holds, or the project's `pin`, whichever is older) to the newest on the index.
    """
    wanted = [normalize(v) for v in versions]
    index = Index()  # reads pip's configuration and the index only when first asked
    if not wanted and first is None and last is None:
        starts = [Version(DEFAULT_FIRST)] + [Version(r.version) for r in list_releases(cache, package=package)[:1]]
        if pin and _is_version(pin):
            starts.append(Version(normalize(pin)))
        first = str(min(starts))
    if first is not None or last is not None:
        offered = lister() if lister else index_versions(index, package)
        in_range = select_versions(offered, first=first, last=last, pre=pre)
        if not in_range:
            raise UpstreamError(
                f"the index offers no {package} release between {first or 'the first'} and {last or 'the newest'}",
                hint="check --from/--to (pre-releases only with --pre)",
            )
        wanted += in_range
    if not wanted:
        return list_releases(cache, package=package)
    return build_history(wanted, cache=cache, package=package, downloader=downloader, index=index, report=report)
