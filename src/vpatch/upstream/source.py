"""Which repository answers a project's refs (the mirror or the release history), and the one rule for the
commit the project is pinned to (`pin_commit`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vpatch import git
from vpatch.base import VpatchError, cache_dir
from vpatch.upstream.mirror import mirror_path

if TYPE_CHECKING:
    from vpatch.config import Config


def history_path(cache: Path | None = None, package: str = "vllm") -> Path:
    """The bare repository holding the release history of `package` (built by upstream.releases)."""
    return (cache or cache_dir()) / "releases" / f"{package}.git"


def open_upstream(config: Config) -> Path:
    """The bare repository that answers refs for this project; an error with a hint when it is missing."""

    if config.upstream.source == "releases":
        path = history_path(cache_dir(), config.upstream.releases or "vllm")
        what, hint = "release history", "run `vpatch releases` to build it from PyPI"
    else:

        path = mirror_path(cache_dir(), config.upstream.git)
        what, hint = f"mirror of {config.upstream.git}", "run `vpatch fetch` to create it"
    if not git.is_repo(path):
        raise VpatchError(f"the upstream {what} is not in the cache ({path})", hint=hint)
    return path


def resolve(repo: Path, ref: str, *, what: str = "ref") -> str:
    """The commit a ref names upstream, or an error naming the ref."""

    commit = git.resolve_commit(repo, ref)
    if commit is None:
        raise VpatchError(
            f"unknown {what} {ref!r}: upstream has no such tag, branch or commit",
            hint="vpatch fetch (or vpatch releases) to update upstream; `git -C <cache repo> tag` lists what it has",
        )
    return commit


def pin_commit(repo: Path, config: Config, *, moved_ok: bool = False) -> str:
    """The commit the project is pinned to: the recorded pin.commit, checked against upstream, else the ref's.

    A recorded commit that upstream no longer has (the release history was rebuilt, then garbage-collected),
    or that its tag no longer names (the history was rebuilt, e.g. an older release added), is explained with
    the fix instead of surfacing as a raw git error or as a bogus "downgrade". `moved_ok` accepts a moved
    ref while the recorded commit exists (apply keeps building what the project pinned).
    """

    recorded = config.pin.commit
    if not recorded:
        return resolve(repo, config.pin.ref)
    now = git.resolve_commit(repo, config.pin.ref)
    fix = (f"re-resolve the pin: in vpatch.yaml set pin.commit to {now} (what {config.pin.ref} names now; check "
           "it is the release you mean) and commit that" if now else
           f"upstream has no {config.pin.ref} either: vpatch fetch / vpatch releases, or fix pin.ref in vpatch.yaml")
    if git.resolve_commit(repo, recorded) is None:
        raise VpatchError(f"the pin's recorded commit {recorded[:12]} ({config.pin.ref}) is not in the upstream "
                          f"repository {repo}; upstream history was rebuilt or pruned since the pin was recorded",
                          hint=fix)
    if now != recorded and not moved_ok and (config.upstream.source == "releases" or _is_tag(repo, config.pin.ref)):
        raise VpatchError(f"the pin {config.pin.ref} is recorded as commit {recorded[:12]}, but upstream's "
                          f"{config.pin.ref} is now {(now or 'nothing')[:12]}: the upstream history was rebuilt "
                          "(adding an older release to the release history rewrites every later commit)",
                          hint=fix)
    return recorded


def pin_moved(repo: Path, config: Config) -> bool:
    """Whether pin.ref now names another commit upstream than the recorded pin.commit: a `moved_ok` caller
    (apply, probe check) keeps the recorded commit and says so."""

    return bool(config.pin.commit) and git.resolve_commit(repo, config.pin.ref) != config.pin.commit


def _is_tag(repo: Path, ref: str) -> bool:

    return git.resolve_commit(repo, f"refs/tags/{ref}") is not None
