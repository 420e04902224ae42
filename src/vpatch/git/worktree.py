"""Work trees: adding and removing them, checking out, applying and committing in one, `git am -3`."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from vpatch.base import GitError, exclusive, process_failure
from vpatch.git.core import Identity, Result, run
from vpatch.git.index import temp_index
from vpatch.git.moves import MERGE_RENAME_LIMIT
from vpatch.git.refs import head

# Every change to a repository's work tree registrations (add, move, remove, prune) is made under this lock, beside
# git's own state: the release history and the mirrors are shared by every vpatch process of the machine. `git
# worktree add` makes worktrees/<id>/ first and marks it locked ("initializing") only after; a `git worktree prune`
# of another process that looks in between finds no gitdir file there and deletes the folder, under the new tree's
# check-out: "fatal: Could not write new index file." (a cold CI run at load 5-7), "not a git repository", or
# "could not open 'worktrees/<id>/locked'" (tests/git/test_worktree.py). The check-out, the long part, runs outside
# the lock: once registered, a tree whose folder exists is never pruned.
REGISTRATIONS_LOCK = "vpatch-worktrees.lock"


@contextmanager
def _registrations(repo: Path) -> Iterator[None]:
    found = run(repo, ["rev-parse", "--path-format=absolute", "--git-common-dir"], check=False)
    if found.returncode != 0:  # no repository (gone, or never made): no registration to guard, git says the rest
        yield
        return
    with exclusive(Path(found.out.strip()) / REGISTRATIONS_LOCK, what=f"change to the work trees of {repo}", wait=True):
        yield


def add_worktree(repo: Path, dest: Path, commit: str) -> None:
    """A work tree of `repo` at `dest`, HEAD detached at `commit`, its files checked out."""
    with _registrations(repo):
        run(repo, ["worktree", "add", "--detach", "--no-checkout", "--quiet", str(dest), commit])
    try:
        # what `git worktree add` runs to check out, here outside the lock
        run(dest, ["reset", "--hard", "--quiet", "--no-recurse-submodules"])
    except BaseException:
        remove_worktree(repo, dest)
        raise


def remove_worktree(repo: Path, dest: Path) -> None:
    with _registrations(repo):
        run(repo, ["worktree", "remove", "--force", "--force", str(dest)], check=False)
        run(repo, ["worktree", "prune"], check=False)


def forget_worktrees(repo: Path, *under: Path) -> None:
    """Drop every registration of a work tree at or below one of `under`, locked ones included.

    A `git worktree add` killed mid-checkout leaves its registration locked ("initializing"); `prune`
    skips locked entries and the next `add` at that path then fails, so vpatch unlocks its own first.
    """
    with _registrations(repo):
        _forget_worktrees(repo, under)


def _forget_worktrees(repo: Path, under: Sequence[Path]) -> None:
    out = run(repo, ["worktree", "list", "--porcelain", "-z"], check=False).stdout
    roots = [os.path.realpath(u) for u in under]
    for record in out.split(b"\0\0"):
        fields = [f.decode("utf-8", "surrogateescape") for f in record.split(b"\0") if f]
        path = next((f.removeprefix("worktree ") for f in fields if f.startswith("worktree ")), None)
        if path is None:
            continue
        real = os.path.realpath(path)
        if not any(real == root or real.startswith(root + os.sep) for root in roots):
            continue
        if any(f == "locked" or f.startswith("locked ") for f in fields):
            run(repo, ["worktree", "unlock", path], check=False)
        run(repo, ["worktree", "remove", "--force", "--force", path], check=False)
    run(repo, ["worktree", "prune"], check=False)


def move_worktree(repo: Path, src: Path, dest: Path) -> None:
    # git renames the folder before it writes the new path into the registration: a prune in between takes it
    with _registrations(repo):
        run(repo, ["worktree", "move", str(src), str(dest)])


def clone_local(source: Path, dest: Path) -> None:
    """A standalone clone of a local repository (objects hard-linked), nothing checked out."""
    run(source, ["clone", "--quiet", "--local", "--no-checkout", str(source), str(dest)])


def clone_shared(source: Path, dest: Path) -> None:
    """A repository of its own at `dest` that borrows `source`'s objects (git's alternates), nothing checked out:
    its branches and commits are its own, so nothing in a shared mirror changes."""
    run(source, ["clone", "--quiet", "--shared", "--no-checkout", str(source), str(dest)])


def checkout_detached(worktree: Path, commit: str) -> None:
    """Point a work tree's HEAD at `commit` (detached) with its index and files."""
    run(worktree, ["checkout", "--detach", "--quiet", "--force", commit])


def switch_tree(worktree: Path, old: str, new: str) -> None:
    """Make the index and the files of `worktree` go from tree-ish `old` to `new` (a two-way merge).

    Only paths that differ are touched; git refuses, touching nothing, when one of them holds local edits.
    """
    run(worktree, ["read-tree", "-m", "-u", old, new])


def extract_tree(repo: Path, treeish: str, dest: Path) -> None:
    """Write every file of `treeish` under `dest`, straight from the object database.

    A throwaway index and checkout-index rather than `git archive`: archive would apply the
    tree's own export-ignore/export-subst attributes, and a probe must see the tree as it is.

    Nothing outlives a kill of vpatch (kill -9, SIGTERM) in the middle: the index lies beside `dest`, in its
    parent folder, so whoever cleans up a half-done extraction (the probe workspace's owned run folder) removes
    it too, and git dies with vpatch instead of writing on into a folder the next command is removing.
    A filesystem that ran full says so (git's own message only says "unable to write file ...").
    """
    dest.mkdir(parents=True, exist_ok=True)
    with temp_index(repo, dest.parent) as env:
        try:
            run(repo, ["read-tree", treeish], env=env, die_with_parent=True)
            run(repo, ["--work-tree", str(dest), "checkout-index", "--all", "--force"], env=env, die_with_parent=True)
        except GitError as exc:
            full = disk_full(exc, dest)
            if full is None:
                raise
            raise full from exc


def tree_changes(repo: Path, old: str, new: str) -> list[tuple[str, str]]:
    """(status letter, path) of every file that differs between tree-ishes `old` and `new`, renames not looked for
    (a moved file is a deletion and an addition)."""
    out = run(repo, ["diff-tree", "-r", "-z", "--no-renames", "--no-commit-id", old, new]).stdout
    fields = out.split(b"\0")
    changes = []
    for raw, path in zip(fields[0::2], fields[1::2]):
        if raw.startswith(b":"):
            changes.append((raw.split()[-1].decode()[:1], path.decode("utf-8", "surrogateescape")))
    return changes


def derive_tree(repo: Path, base: Path, base_tree: str, changes: Sequence[tuple[str, str]], treeish: str,
                dest: Path) -> None:
    """Write `treeish` under `dest` as extract_tree does, from `base`, an extraction of `base_tree`, which differs
    from it by `changes` (tree_changes): every file the two share is a hard link to base's, the changed and added
    ones are written from the object database, the deleted ones are left out.

    The files linked are those git lists in `base_tree`, not what `base` holds: a file a run left there is not
    carried over; one missing there is an OSError (the caller extracts the tree whole instead). The shared files
    are one file on disk: writing one in place writes both trees (a probe must not write into its tree). A
    changed file is never written through a link: it is left out of the links and written anew."""
    skip = {path for _, path in changes}
    dest.mkdir(parents=True, exist_ok=True)
    made: set[str] = set()
    for entry in run(repo, ["ls-tree", "-r", "-z", "--full-tree", base_tree]).stdout.split(b"\0"):
        meta, tab, raw = entry.partition(b"\t")
        path = raw.decode("utf-8", "surrogateescape")
        if not tab or path in skip:
            continue
        folder = path.rpartition("/")[0]
        if folder and folder not in made:
            os.makedirs(dest / folder, exist_ok=True)
            made.add(folder)
        if meta.startswith(b"160000"):  # a submodule: a fresh extraction leaves an empty folder there
            os.mkdir(dest / path)
        else:  # a file or a symbolic link (the link itself, not what it names)
            os.link(base / path, dest / path, follow_symlinks=False)
    written = [path for status, path in changes if status != "D"]
    if not written:
        return
    with temp_index(repo, dest.parent) as env:
        try:
            run(repo, ["read-tree", treeish], env=env, die_with_parent=True)
            run(repo, ["--work-tree", str(dest), "checkout-index", "--force", "-z", "--stdin"], env=env,
                input=b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in written), die_with_parent=True)
        except GitError as exc:
            full = disk_full(exc, dest)
            if full is None:
                raise
            raise full from exc


# Below this much free space a failed write is taken for a full disk (git may not say ENOSPC).
_FULL_BYTES = 1 << 20


def disk_full(exc: GitError, folder: Path) -> GitError | None:
    """The error for a git command that failed writing under `folder` because its filesystem is full (git's
    message says "No space left", or under 1 MiB is free there), naming that filesystem; None when it is not full."""
    try:
        stats = os.statvfs(folder)
        free = stats.f_bavail * stats.f_frsize
    except OSError:
        free = None
    if "no space left" not in exc.output.lower() and (free is None or free >= _FULL_BYTES):
        return None
    mount = _mount_point(folder)
    left = "" if free is None else f" ({free:,} bytes free)"
    return GitError(f"no space left on the filesystem of {mount}{left}: {exc.message}",
                    command=exc.command, returncode=exc.returncode, output=exc.output,
                    hint=f"free space on {mount}, or set VPATCH_CACHE to a folder on a filesystem with room")


def _mount_point(path: Path) -> Path:
    """The folder `path`'s filesystem is mounted at (the highest ancestor on the same device)."""
    path = path.resolve()
    device = path.stat().st_dev
    while path.parent != path and path.parent.stat().st_dev == device:
        path = path.parent
    return path


def dirty_paths(worktree: Path, pathspec: Sequence[str] = ()) -> list[str]:
    """Paths with uncommitted changes (tracked or untracked) in a work tree."""
    out = run(worktree, ["status", "--porcelain=v1", "-z", "--untracked-files=all", "--", *pathspec]).stdout
    return [rec[3:].decode("utf-8", "surrogateescape") for rec in out.split(b"\0") if len(rec) > 3]


def unmerged_paths(worktree: Path) -> list[str]:
    """Paths with unresolved conflicts in the index of a work tree."""
    out = run(worktree, ["diff", "--name-only", "--diff-filter=U", "-z"]).stdout
    return [p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p]


def index_matches(worktree: Path, treeish: str) -> bool:
    """Whether the index holds exactly `treeish`; read-only, so it works while another git holds index.lock."""
    result = run(worktree, ["diff-index", "--cached", "--quiet", treeish, "--"], check=False)
    if result.returncode not in (0, 1):
        raise process_failure(["git", "diff-index", "--cached", "--quiet", treeish], result, error=GitError)
    return result.returncode == 0


def refresh_index(worktree: Path) -> None:
    """Refresh the index's stat data of a work tree (files rewritten with their indexed content)."""
    run(worktree, ["update-index", "-q", "--refresh"], check=False)


def apply_to_worktree(worktree: Path, patch: bytes, *, three_way: bool = False) -> Result:
    """Apply a patch to the index and work tree; returns the result without raising."""
    args = ["apply", "--index", "--verbose"]
    if three_way:
        args.append("--3way")
    return run(worktree, args, input=patch, check=False)


def commit_index(worktree: Path, message: str, author: Identity | None = None, *,
                 committer: Identity | None = None) -> str:
    """Commit the index (an empty one too), the message verbatim, no hooks; with an explicit author (and
    committer, default: the author), or without one as the person git is configured for."""
    committer = committer or author
    env: dict[str, str] = {}
    for role, who in (("AUTHOR", author), ("COMMITTER", committer)):
        if who is not None:
            env |= {f"GIT_{role}_NAME": who.name, f"GIT_{role}_EMAIL": who.email, f"GIT_{role}_DATE": who.date}
    run(
        worktree,
        ["commit", "--quiet", "--allow-empty", "--no-verify", "--cleanup=verbatim", "-F", "-"],
        input=message.encode(),
        env=env,
    )
    return head(worktree)


def start_branch(worktree: Path, branch: str) -> None:
    """Put the work tree on `branch` at its HEAD: made there, or moved there when it exists (`checkout -B`)."""
    run(worktree, ["checkout", "--quiet", "-B", branch])


def reset_soft(worktree: Path, commit: str) -> None:
    """Point HEAD (and its branch) at `commit`, keeping the index and the files as they are."""
    run(worktree, ["reset", "--soft", "--quiet", commit])


def stage_all(worktree: Path) -> None:
    """Stage every change of the work tree, new and deleted files included."""
    run(worktree, ["add", "-A"])


def discard_changes(worktree: Path) -> None:
    """Put the index and files back at HEAD and delete untracked files (not ignored ones)."""
    run(worktree, ["reset", "--hard", "--quiet", "HEAD"])
    run(worktree, ["clean", "-fdq"])


def am_three_way(worktree: Path, patch: bytes) -> Result:
    """`git am -3` of one mail-form patch in a work tree (rename-following 3-way fallback); returns the result,
    never raises; a failed am is aborted, leaving the work tree as it was."""
    # only the tree counts: a fixed committer, so that a user without a git identity can run it too
    env = {"GIT_COMMITTER_NAME": "vpatch", "GIT_COMMITTER_EMAIL": "vpatch@localhost"}
    # merge.renames follows diff.renames, which vpatch turns off for its own diffs: git's default is on
    result = run(worktree, ["-c", "merge.renames=true", "-c", f"merge.renameLimit={MERGE_RENAME_LIMIT}", "am", "-3",
                            "--keep-cr", "--quiet"], input=patch, env=env, check=False)
    if result.returncode != 0:
        run(worktree, ["am", "--abort"], check=False)
    return result


def staged_diff(worktree: Path, base: str) -> bytes:
    """The index of a work tree against `base`, as a binary diff `git apply --index` takes back."""
    return run(worktree, ["diff", "--cached", "--binary", "--full-index", base, "--"]).stdout


def tree_diff(repo: Path, old: str, new: str) -> bytes:
    """The diff from tree-ish `old` to `new`, binary, as `git apply` takes it."""
    return run(repo, ["diff", "--binary", "--full-index", "--no-renames", old, new, "--"]).stdout


def staged_paths(worktree: Path, base: str) -> list[str]:
    """The paths whose staged content differs from `base`."""
    out = run(worktree, ["diff", "--cached", "--name-only", "-z", base, "--"]).stdout
    return [p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p]


def worktree_diff(worktree: Path) -> bytes:
    """The tracked files of a work tree against HEAD (conflicted ones with their markers), without staging."""
    return run(worktree, ["diff", "--binary", "HEAD", "--"]).stdout
