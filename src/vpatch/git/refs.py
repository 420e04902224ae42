"""Refs and names: resolving a ref to a commit, ancestry, tags and branches, ref transactions, the mirror's remote."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vpatch.base import GitError, process_failure, stream_process
from vpatch.git.core import Result, command, run


def init_bare(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    run(path, ["init", "--bare", "--quiet", "."])


def is_repo(path: Path) -> bool:
    if not path.exists():
        return False
    result = run(path, ["rev-parse", "--git-dir"], check=False)
    return result.returncode == 0


def resolve_commit(repo: Path, ref: str) -> str | None:
    """The commit SHA that `ref` names in `repo`, or None when it names nothing."""
    if not ref or ref.startswith("-"):
        return None
    result = run(repo, ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"], check=False)
    if result.returncode != 0:
        return None
    return result.out.strip()


def resolve_commits(repo: Path, refs: Sequence[str]) -> dict[str, str | None]:
    """The commit each ref names (None: names nothing), answered by one `cat-file --batch-check`."""
    if not refs:
        return {}
    request = "".join(f"{ref}^{{commit}}\n" for ref in refs).encode()
    lines = run(repo, ["cat-file", "--batch-check=%(objectname) %(objecttype)"], input=request).out.splitlines()
    return {
        ref: (line.split()[0] if line.endswith(" commit") and not ref.startswith("-") else None)
        for ref, line in zip(refs, lines)
    }


_OBJECT_ID = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")  # SHA-1 or SHA-256, in full
# (repository, commit or tree id) -> its tree: an object id names one content, so the answer cannot change
_trees: dict[tuple[Path, str], str] = {}


def tree_of(repo: Path, commit: str) -> str:
    """The tree of `commit` (a ref, a commit or a tree). Kept for the process where `commit` is an object id in
    full: a warm status asks for the same few trees dozens of times, one git process each."""
    key = (repo, commit)
    found = _trees.get(key)
    if found is None:
        found = run(repo, ["rev-parse", "--verify", f"{commit}^{{tree}}"]).out.strip()
        if _OBJECT_ID.fullmatch(commit):
            _trees[key] = found
    return found


def object_at(repo: Path, treeish: str, path: str) -> str:
    """The id of the tree or blob at `path` in `treeish`."""
    return run(repo, ["rev-parse", "--verify", f"{treeish}:{path}"]).out.strip()


def is_ancestor(repo: Path, ancestor: str, descendant: str) -> bool:
    args = ["merge-base", "--is-ancestor", ancestor, descendant]
    result = run(repo, args, check=False)
    if result.returncode not in (0, 1):
        raise process_failure(["git", *args], result, error=GitError)
    return result.returncode == 0


def merge_base(repo: Path, a: str, b: str) -> str | None:
    result = run(repo, ["merge-base", a, b], check=False)
    return result.out.strip() or None


def tags(repo: Path, pattern: str = "v*") -> list[str]:
    out = run(repo, ["tag", "--list", pattern]).out
    return [line for line in out.splitlines() if line]


def tag_at(repo: Path, commit: str, pattern: str = "v*") -> str | None:
    """A tag matching `pattern` that names exactly `commit` (the lowest by version order), or None."""
    out = run(repo, ["tag", "--list", "--points-at", commit, "--sort=version:refname", pattern]).out.split()
    return out[0] if out else None


def refs_containing(repo: Path, commit: str, tag_pattern: str = "v*") -> tuple[list[str], list[str]]:
    """(tags matching `tag_pattern`, local branches) whose tip contains `commit`: one walk for both."""
    out = run(repo, ["for-each-ref", "--contains", commit, "--format=%(refname)", f"refs/tags/{tag_pattern}",
                     "refs/heads/"]).out.split()
    return ([r.removeprefix("refs/tags/") for r in out if r.startswith("refs/tags/")],
            [r.removeprefix("refs/heads/") for r in out if r.startswith("refs/heads/")])


def branches_containing(repo: Path, commit: str) -> list[str]:
    """Local branch names (in a mirror: upstream's branches) whose tip contains `commit`."""
    out = run(repo, ["for-each-ref", "--contains", commit, "--format=%(refname:short)", "refs/heads/"]).out
    return out.split()


def ref_values(repo: Path, prefix: str) -> dict[str, str]:
    """Every ref under `prefix` (e.g. "refs/tags/") with the object it points to."""
    out = run(repo, ["for-each-ref", "--format=%(refname) %(objectname)", prefix]).out
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


@dataclass(frozen=True)
class RefUpdate:
    ref: str
    new: str  # ZERO_SHA deletes the ref
    old: str | None = None  # when set, the update fails unless the ref still holds it (ZERO_SHA: absent)


def update_refs(repo: Path, updates: Sequence[RefUpdate]) -> None:
    """Apply all ref updates in one transaction: either every ref moves or none does."""
    if not updates:
        return
    lines = ["start"]
    for u in updates:
        lines.append(f"update {u.ref} {u.new}" + (f" {u.old}" if u.old is not None else ""))
    lines += ["prepare", "commit"]
    run(repo, ["update-ref", "--stdin"], input=("\n".join(lines) + "\n").encode())


def set_head(repo: Path, ref: str) -> None:
    run(repo, ["symbolic-ref", "HEAD", ref])


def head(worktree: Path) -> str:
    return run(worktree, ["rev-parse", "--verify", "HEAD"]).out.strip()


def head_ref(worktree: Path) -> str:
    """The branch HEAD points at ("refs/heads/main"), or "HEAD" when it is detached."""
    result = run(worktree, ["symbolic-ref", "-q", "HEAD"], check=False)
    return result.out.strip() if result.returncode == 0 else "HEAD"


def toplevel(path: Path) -> Path | None:
    """The work tree root of the repository holding `path`, or None when it is in none."""
    result = run(path, ["rev-parse", "--show-toplevel"], check=False)
    return Path(result.out.strip()) if result.returncode == 0 else None


def git_dir(worktree: Path) -> Path:
    """This work tree's own git folder (absolute), where per-checkout state such as rebase state lives."""
    return Path(run(worktree, ["rev-parse", "--absolute-git-dir"]).out.strip())


def add_mirror_remote(repo: Path, url: str) -> None:
    """Make `url` the remote `origin` that `fetch_mirror` mirrors every ref of."""
    run(repo, ["remote", "add", "--mirror=fetch", "origin", url])


def fetch_mirror(repo: Path, on_progress: Callable[[str], None], *, blob_filter: str | None = None) -> Result:
    """`git fetch --prune --tags origin` with git's own progress lines handed to `on_progress`; with
    `blob_filter` ("blob:none") the first fetch makes `repo` a partial clone (blobs fetched when read)."""
    if blob_filter:
        run(repo, ["config", "remote.origin.promisor", "true"])
        run(repo, ["config", "remote.origin.partialclonefilter", blob_filter])
    args = ["fetch", "--progress", "--prune", "--tags", *([f"--filter={blob_filter}"] if blob_filter else []), "origin"]
    return stream_process(command(args), on_progress, cwd=repo, check=False, shown=["git", *args],
                          error=GitError)


def fetch_blobs(repo: Path, blobs: Sequence[str], on_progress: Callable[[str], None], *, blob_filter: str) -> Result:
    """Fetch `blobs` (object ids a partial clone lacks) from its promisor remote in one request: what git's own
    lazy fetch asks for one object at a time, with the same options; git's progress lines go to `on_progress`."""
    args = ["-c", "fetch.negotiationAlgorithm=noop", "fetch", "--progress", "origin", "--no-tags",
            "--no-write-fetch-head", "--recurse-submodules=no", f"--filter={blob_filter}", "--stdin"]
    return stream_process(command(args), on_progress, cwd=repo, check=False, shown=["git", *args[2:5]],
                          input="".join(f"{b}\n" for b in blobs).encode(), error=GitError)


def partial_filter(repo: Path) -> str | None:
    """The filter a partial clone was made with (None: a full repository)."""
    result = run(repo, ["config", "--get", "remote.origin.partialclonefilter"], check=False)
    return result.out.strip() or None


def write_commit_graph(repo: Path) -> None:
    """A commit-graph with changed-path Bloom filters: generation numbers make --contains, merge-base and
    topological walks cheap, the filters let a path-limited walk skip most tree diffs (reused on a rewrite)."""
    run(repo, ["commit-graph", "write", "--reachable", "--changed-paths"])
