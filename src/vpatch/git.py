"""The one door to git: every git command vpatch runs goes through this module."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from vpatch import process
from vpatch.errors import GitError
from vpatch.process import Output as Result

# Options that make vpatch's own git output independent of the user's config.
_STABLE_CONFIG = (
    "-c", "core.quotepath=true",
    "-c", "diff.noprefix=false",
    "-c", "diff.mnemonicPrefix=false",
    "-c", "diff.relative=false",
    "-c", "diff.renames=false",
    "-c", "core.abbrev=40",
    "-c", "format.signature=",
    "-c", "advice.detachedHead=false",
    "-c", "core.autocrlf=false",
    "-c", "apply.whitespace=nowarn",
)

ZERO_SHA = "0" * 40


@dataclass(frozen=True)
class Identity:
    name: str
    email: str
    date: str  # anything git accepts, e.g. "Sat, 6 Sep 2026 12:00:00 +0000"


def run(
    cwd: Path,
    args: Sequence[str],
    *,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float | None = None,
) -> Result:
    """Run one git command; on failure raise GitError naming the command, exit code and output."""
    return process.run(["git", *_STABLE_CONFIG, *args], cwd=cwd, input=input, env=env, check=check,
                       timeout=timeout, shown=["git", *args], error=GitError)


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


def tree_of(repo: Path, commit: str) -> str:
    return run(repo, ["rev-parse", "--verify", f"{commit}^{{tree}}"]).out.strip()


def is_ancestor(repo: Path, ancestor: str, descendant: str) -> bool:
    args = ["merge-base", "--is-ancestor", ancestor, descendant]
    result = run(repo, args, check=False)
    if result.returncode not in (0, 1):
        raise process.failure(["git", *args], result, error=GitError)
    return result.returncode == 0


def tags(repo: Path, pattern: str = "v*") -> list[str]:
    out = run(repo, ["tag", "--list", pattern]).out
    return [line for line in out.splitlines() if line]


def read_blobs(repo: Path, treeish: str, paths: Sequence[str]) -> dict[str, bytes | None]:
    """Contents of `paths` in `treeish`, read from the object database (None: path absent)."""
    return read_blobs_at(repo, [treeish], paths)[treeish]


def ls_tree(repo: Path, treeish: str, paths: Sequence[str]) -> list[tuple[str, str, str, str]]:
    """(mode, type, sha, path) entries for `paths` in `treeish`; absent paths are left out."""
    if not paths:
        return []
    out = run(repo, ["ls-tree", "-z", "--full-tree", treeish, "--", *paths]).stdout
    entries = []
    for record in out.split(b"\0"):
        if not record:
            continue
        meta, path = record.split(b"\t", 1)
        mode, kind, sha = meta.decode().split()
        entries.append((mode, kind, sha, path.decode("utf-8", "surrogateescape")))
    return entries


# --- worktrees -------------------------------------------------------------


def add_worktree(repo: Path, dest: Path, commit: str) -> None:
    run(repo, ["worktree", "add", "--detach", "--quiet", str(dest), commit])


def remove_worktree(repo: Path, dest: Path) -> None:
    run(repo, ["worktree", "remove", "--force", "--force", str(dest)], check=False)
    run(repo, ["worktree", "prune"], check=False)


def forget_worktrees(repo: Path, *under: Path) -> None:
    """Drop every registration of a work tree at or below one of `under`, locked ones included.

    A `git worktree add` killed mid-checkout leaves its registration locked ("initializing"); `prune`
    skips locked entries and the next `add` at that path then fails, so vpatch unlocks its own first.
    """
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


def head(worktree: Path) -> str:
    return run(worktree, ["rev-parse", "--verify", "HEAD"]).out.strip()


def dirty_paths(worktree: Path, pathspec: Sequence[str] = ()) -> list[str]:
    """Paths with uncommitted changes (tracked or untracked) in a work tree."""
    out = run(worktree, ["status", "--porcelain=v1", "-z", "--untracked-files=all", "--", *pathspec]).stdout
    return [rec[3:].decode("utf-8", "surrogateescape") for rec in out.split(b"\0") if len(rec) > 3]


def commits_between(worktree: Path, base: str, tip: str = "HEAD") -> list[str]:
    """Commits in base..tip, oldest first."""
    out = run(worktree, ["rev-list", "--reverse", "--topo-order", f"{base}..{tip}"]).out
    return out.split()


def local_commits(worktree: Path) -> list[str]:
    """Commits of HEAD that no branch or tag of the repository has (made in this work tree), oldest first."""
    out = run(worktree, ["rev-list", "--reverse", "--topo-order", "HEAD", "--not", "--branches", "--tags",
                         "--remotes"]).out
    return out.split()


def parents(worktree: Path, commit: str) -> list[str]:
    return run(worktree, ["rev-list", "--parents", "-n", "1", commit]).out.split()[1:]


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


def format_patch(repo: Path, commit: str) -> bytes:
    """One commit as a mail-form patch without churn: zero From sha, full index, no signature, no stat."""
    return run(
        repo,
        [
            "format-patch", "-1", "--stdout", "--zero-commit", "--full-index", "--no-signature",
            "--no-stat", "-k", "--no-renames", "--binary", commit,
        ],
    ).stdout


@dataclass(frozen=True)
class MailInfo:
    author: Identity
    subject: str
    body: str  # message after the subject line, trailers included
    diff: bytes


def mailinfo(patch: bytes) -> MailInfo:
    """Split a mail-form patch into author, subject, body and diff with git's own parser."""
    with tempfile.TemporaryDirectory(prefix="vpatch-mailinfo-") as tmp:
        msg, diff = Path(tmp, "msg"), Path(tmp, "diff")
        out = run(Path(tmp), ["mailinfo", "-k", "--encoding=UTF-8", str(msg), str(diff)], input=patch).out
        fields: dict[str, str] = {}
        for line in out.splitlines():
            key, _, value = line.partition(": ")
            fields[key] = value
        return MailInfo(
            author=Identity(fields.get("Author", ""), fields.get("Email", ""), fields.get("Date", "")),
            subject=fields.get("Subject", ""),
            body=msg.read_text(encoding="utf-8", errors="surrogateescape"),
            diff=diff.read_bytes(),
        )


# --- temporary index: textual checks without a checkout ---------------------


@contextmanager
def temp_index(repo: Path) -> Iterator[dict[str, str]]:
    """An environment whose GIT_INDEX_FILE is a fresh, throwaway index file."""
    fd, name = tempfile.mkstemp(prefix="vpatch-index-")
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
    entries = ls_tree(repo, treeish, paths)
    info = "".join(f"{mode} {sha}\t{path}\n" for mode, _kind, sha, path in entries if _kind == "blob")
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


def patch_id(repo: Path, diff: bytes) -> str | None:
    """git's stable patch-id of a diff (None when the diff is empty)."""
    out = run(repo, ["patch-id", "--stable"], input=diff).out.split()
    return out[0] if out else None


# --- history queries for landing verdicts ----------------------------------


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


def commit_times(repo: Path, commits: Sequence[str]) -> dict[str, int]:
    """Committer time (seconds since the epoch) of each commit, read from the commit objects."""
    if not commits:
        return {}
    if not all(is_object_id(c) for c in commits):
        out = run(repo, ["log", "--no-walk=unsorted", "--format=%H %ct", *commits, "--"]).out
        return {sha: int(ct) for sha, ct in (line.split() for line in out.splitlines() if line)}
    times: dict[str, int] = {}
    for sha, found in zip(commits, _cat_file(repo, list(commits))):
        if found is None or found[0] != "commit":
            raise GitError(f"git cat-file: {sha} is no commit in {repo}", command=("git", "cat-file", "--batch"),
                           returncode=None, output="")
        header = found[1].split(b"\n\n", 1)[0]
        committer = next(line for line in header.split(b"\n") if line.startswith(b"committer "))
        times[sha] = int(committer.rsplit(b" ", 2)[1])
    return times


def read_blobs_at(repo: Path, commits: Sequence[str], paths: Sequence[str]) -> dict[str, dict[str, bytes | None]]:
    """Contents of `paths` at each of `commits` (commit -> path -> content; None: absent, or no file there).

    Names that are object ids are read by this process's one `cat-file --batch` for `repo` (catfile.py);
    others (a branch, HEAD) by a `cat-file --batch` of their own, so a moved ref is always read as it is now."""
    out: dict[str, dict[str, bytes | None]] = {c: {} for c in commits}
    if not commits or not paths:
        return out
    by_id = [c for c in commits if is_object_id(c)]
    found = iter(_cat_file(repo, [f"{c}:{p}" for c in by_id for p in paths]))
    for c in by_id:
        for p in paths:
            obj = next(found)
            # a tree or gitlink at that path is no file
            out[c][p] = obj[1] if obj is not None and obj[0] == "blob" else None
    others = [c for c in commits if not is_object_id(c)]
    if others:
        request = "".join(f"{c}:{p}\n" for c in others for p in paths).encode()
        data = run(repo, ["cat-file", "--batch"], input=request).stdout
        pos = 0
        for c in others:
            for p in paths:
                nl = data.index(b"\n", pos)
                header = data[pos:nl].split()
                pos = nl + 1
                if header[-1] == b"missing" or len(header) != 3:
                    out[c][p] = None
                    continue
                size = int(header[2])
                # a tree at that path is no file, but its content is in the stream all the same
                out[c][p] = data[pos:pos + size] if header[1] == b"blob" else None
                pos += size + 1
    return out


def is_object_id(name: str) -> bool:
    """Whether `name` is a full object id (which names one object forever), not a ref that can move."""
    return len(name) in (40, 64) and all(ch in "0123456789abcdef" for ch in name)


def _cat_file(repo: Path, names: Sequence[str]) -> list[tuple[str, bytes] | None]:
    """(type, content) of each object named by an object id, from the repository's long-lived reader."""
    from vpatch import catfile

    return catfile.read(repo, ["git", *_STABLE_CONFIG, "cat-file", "--batch"], ["git", "cat-file", "--batch"], names)


def reachable_count(repo: Path, commit: str) -> int:
    """How many commits `commit` reaches: an ancestor always counts fewer than its descendants."""
    return int(run(repo, ["rev-list", "--count", commit, "--"]).out.strip())


def merge_base(repo: Path, a: str, b: str) -> str | None:
    result = run(repo, ["merge-base", a, b], check=False)
    return result.out.strip() or None


def first_parent_commits(repo: Path, base: str, tip: str) -> list[str]:
    """First-parent commits in base..tip, oldest first (the line a bisection walks)."""
    return run(repo, ["rev-list", "--first-parent", "--reverse", f"{base}..{tip}", "--"]).out.split()


def tags_containing(repo: Path, commit: str, pattern: str = "v*") -> list[str]:
    return run(repo, ["tag", "--list", "--contains", commit, pattern]).out.split()


# --- object database writes: fast-import and ref transactions ---------------


def fast_import(repo: Path, stream: Iterable[bytes]) -> dict[str, str]:
    """Feed a fast-import stream (ending in `done`) to `repo`; returns its marks (":N" -> sha).

    The stream is written as it is produced, so a large import never sits in memory whole.
    Refs named in the stream are updated only when git reaches `done`; an interrupted import
    leaves loose objects but no ref changes.
    """
    with tempfile.TemporaryDirectory(prefix="vpatch-fast-import-") as tmp:
        marks = Path(tmp, "marks")
        args = ["fast-import", "--quiet", "--done", f"--export-marks={marks}"]
        process.feed(["git", *_STABLE_CONFIG, *args], stream, cwd=repo, shown=["git", *args[:3]], error=GitError)
        result: dict[str, str] = {}
        for line in marks.read_text().splitlines():
            mark, sha = line.split()
            result[mark] = sha
        return result


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


@dataclass(frozen=True)
class CommitObject:
    tree: str
    parents: tuple[str, ...]
    author: str  # raw header value: "Name <email> epoch +zone"
    committer: str
    message: str


def read_commit(repo: Path, sha: str) -> CommitObject:
    raw = run(repo, ["cat-file", "commit", sha]).out
    header, _, message = raw.partition("\n\n")
    tree, author, committer, parents = "", "", "", []
    for line in header.splitlines():
        key, _, value = line.partition(" ")
        if key == "tree":
            tree = value
        elif key == "parent":
            parents.append(value)
        elif key == "author":
            author = value
        elif key == "committer":
            committer = value
    return CommitObject(tree, tuple(parents), author, committer, message)


# --- the project's own repository: one commit written as plumbing, then checked out ------------


def toplevel(path: Path) -> Path | None:
    """The work tree root of the repository holding `path`, or None when it is in none."""
    result = run(path, ["rev-parse", "--show-toplevel"], check=False)
    return Path(result.out.strip()) if result.returncode == 0 else None


def git_dir(worktree: Path) -> Path:
    """This work tree's own git folder (absolute), where per-checkout state such as rebase state lives."""
    return Path(run(worktree, ["rev-parse", "--absolute-git-dir"]).out.strip())


def head_ref(worktree: Path) -> str:
    """The branch HEAD points at ("refs/heads/main"), or "HEAD" when it is detached."""
    result = run(worktree, ["symbolic-ref", "-q", "HEAD"], check=False)
    return result.out.strip() if result.returncode == 0 else "HEAD"


def hash_object(repo: Path, data: bytes) -> str:
    """Store `data` as a blob in `repo`'s object database; returns its id."""
    return run(repo, ["hash-object", "-w", "--stdin"], input=data).out.strip()


def tree_with(repo: Path, base: str, writes: Mapping[str, bytes], removes: Iterable[str]) -> str:
    """The tree of `base` with `writes` (path -> content, mode 100644) added or replaced and `removes` gone."""
    with temp_index(repo) as env:
        run(repo, ["read-tree", base], env=env)
        info = "".join(f"100644 {hash_object(repo, data)}\t{path}\n" for path, data in writes.items())
        info += "".join(f"0 {ZERO_SHA}\t{path}\n" for path in removes)
        if info:
            run(repo, ["update-index", "--index-info"], input=info.encode(), env=env)
        return write_tree(repo, env)


def commit_tree(repo: Path, tree: str, parents: Sequence[str], message: str) -> str:
    """A commit object (no ref moves); author and committer come from the user's git config."""
    args = ["commit-tree", tree]
    for parent in parents:
        args += ["-p", parent]
    return run(repo, args, input=message.encode()).out.strip()


def switch_tree(worktree: Path, old: str, new: str) -> None:
    """Make the index and the files of `worktree` go from tree-ish `old` to `new` (a two-way merge).

    Only paths that differ are touched; git refuses, touching nothing, when one of them holds local edits.
    """
    run(worktree, ["read-tree", "-m", "-u", old, new])


def unmerged_paths(worktree: Path) -> list[str]:
    """Paths with unresolved conflicts in the index of a work tree."""
    out = run(worktree, ["diff", "--name-only", "--diff-filter=U", "-z"]).stdout
    return [p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p]


def index_matches(worktree: Path, treeish: str) -> bool:
    """Whether the index holds exactly `treeish`; read-only, so it works while another git holds index.lock."""
    result = run(worktree, ["diff-index", "--cached", "--quiet", treeish, "--"], check=False)
    if result.returncode not in (0, 1):
        raise process.failure(["git", "diff-index", "--cached", "--quiet", treeish], result, error=GitError)
    return result.returncode == 0


# --- trees as files: probes run commands against a tree ----------------------


def extract_tree(repo: Path, treeish: str, dest: Path) -> None:
    """Write every file of `treeish` under `dest`, straight from the object database.

    A throwaway index and checkout-index rather than `git archive`: archive would apply the
    tree's own export-ignore/export-subst attributes, and a probe must see the tree as it is.
    """
    dest.mkdir(parents=True, exist_ok=True)
    with temp_index(repo) as env:
        run(repo, ["read-tree", treeish], env=env)
        run(repo, ["--work-tree", str(dest), "checkout-index", "--all", "--force"], env=env)


def tree_with_patch(repo: Path, treeish: str, patch: bytes) -> str | None:
    """The tree `treeish` becomes with `patch` applied (no checkout), or None when it does not apply."""
    with temp_index(repo) as env:
        load_index(repo, env, treeish)
        if apply_cached(repo, env, patch, check=False).returncode != 0:
            return None
        return write_tree(repo, env)


# --- lineage: release branches, cherry-picks and reverts (read by lineage.py) ------------------


@dataclass(frozen=True)
class LogRecord:
    commit: str
    subject: str
    body: str


def log_records(repo: Path, base: str | None, tip: str, *, grep: Sequence[str] = (), commits: Sequence[str] = ()) -> list[LogRecord]:
    """Commits of base..tip (newest first) whose message contains any of `grep` literally, or, with
    `commits`, exactly those commits (no walk)."""
    fmt = "--format=%H%x1f%s%x1f%b%x1e"
    if commits:
        args = ["log", "--no-walk=unsorted", fmt, *commits, "--"]
    else:
        args = ["log", "--topo-order", fmt, "--fixed-strings", *(f"--grep={g}" for g in grep),
                f"{base}..{tip}" if base else tip, "--"]
    out = run(repo, args).out
    records = []
    for chunk in out.split("\x1e"):
        parts = chunk.strip("\n").split("\x1f")
        if len(parts) == 3 and parts[0]:
            records.append(LogRecord(parts[0], parts[1], parts[2]))
    return records


def topo_order(repo: Path, base: str | None, tip: str) -> list[str]:
    """Commits of base..tip, oldest first, parents before children."""
    return run(repo, ["rev-list", "--topo-order", "--reverse", f"{base}..{tip}" if base else tip, "--"]).out.split()


def patch_id_commits(repo: Path, base: str | None, tip: str, paths: Sequence[str]) -> dict[str, list[str]]:
    """Stable patch-id -> every non-merge commit in base..tip with it (diffs limited to `paths`), newest first."""
    log = run(repo, ["log", "-p", "--no-merges", "--no-renames", "--no-color", "--format=commit %H",
                     f"{base}..{tip}" if base else tip, "--", *paths]).stdout
    if not log.strip():
        return {}
    ids: dict[str, list[str]] = {}
    for line in run(repo, ["patch-id", "--stable"], input=log).out.splitlines():
        pid, sha = line.split()
        ids.setdefault(pid, []).append(sha)
    return ids


def commits_touching(repo: Path, base: str | None, tip: str, paths: Sequence[str]) -> list[str]:
    """The non-merge commits of base..tip that `patch_id_commits` would diff, newest first (same walk, no diffs)."""
    return run(repo, ["rev-list", "--no-merges", f"{base}..{tip}" if base else tip, "--", *paths]).out.split()


def commit_patch_ids(repo: Path, commits: Sequence[str], paths: Sequence[str]) -> dict[str, str]:
    """Commit -> stable patch-id of its change to `paths`, for exactly `commits` (no walk; commits that do not
    change `paths` are left out)."""
    if not commits:
        return {}
    log = run(repo, ["log", "--stdin", "--no-walk=unsorted", "-p", "--no-renames", "--no-color", "--format=commit %H",
                     "--", *paths], input="".join(f"{c}\n" for c in commits).encode()).stdout
    if not log.strip():
        return {}
    return {sha: pid for pid, sha in (line.split() for line in run(repo, ["patch-id", "--stable"], input=log).out.splitlines())}


def commit_diffs(repo: Path, commits: Sequence[str], paths: Sequence[str]) -> dict[str, dict[str, bytes]]:
    """Commit -> path -> that file's part of the commit's diff (limited to `paths`), for exactly `commits`: one
    `log -p` for all of them."""
    if not commits:
        return {}
    log = run(repo, ["log", "--stdin", "--no-walk=unsorted", "-p", "--no-renames", "--no-color", "--format=commit %H",
                     "--", *paths], input="".join(f"{c}\n" for c in commits).encode()).stdout
    out: dict[str, dict[str, bytes]] = {}
    for chunk in log.split(b"\ncommit "):
        head, _, body = chunk.removeprefix(b"commit ").partition(b"\n")
        files = out.setdefault(head.strip().decode(), {})
        for part in (b"\n" + body).split(b"\ndiff --git ")[1:]:
            section = b"diff --git " + part.rstrip(b"\n") + b"\n"
            name = section.split(b"\n", 1)[0].split(b" b/", 1)[-1].decode("utf-8", "surrogateescape")
            files[name] = section
    return out


def stream_patch_ids(repo: Path, stream: bytes) -> dict[str, str]:
    """`git patch-id --stable` of a stream of "commit <id>" headers each followed by a diff: id -> patch-id."""
    if not stream.strip():
        return {}
    return {sha: pid for pid, sha in (line.split() for line in run(repo, ["patch-id", "--stable"], input=stream).out.splitlines())}


def commit_patch_id(repo: Path, commit: str, paths: Sequence[str] = ()) -> str | None:
    """The stable patch-id of one commit's change (limited to `paths` when given)."""
    diff = run(repo, ["diff-tree", "-p", "--no-renames", "--no-color", "--root", commit, "--", *paths]).stdout
    return patch_id(repo, diff) if diff.strip() else None


def changed_paths(repo: Path, commit: str) -> list[str]:
    out = run(repo, ["diff-tree", "--no-commit-id", "--name-only", "-r", "--no-renames", "--root", "-z", commit]).stdout
    return [p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p]


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


# --- upstream moves: where a file went between two commits (read by moves.py) ------------------

# merge-ort's default rename limit: `git am -3` and merges pair renames up to this many files, where a plain
# `git diff` stops at diff.renameLimit (1000); the same limit makes vpatch find what a 3-way merge finds.
MERGE_RENAME_LIMIT = 7000


@dataclass(frozen=True)
class PathChange:
    status: str  # "R" (renamed, maybe edited), "D" (deleted with no successor), "A" (added, no source)
    old: str | None
    new: str | None
    similarity: int = 0  # git's rename score in percent (R only)


def renames_and_deletions(repo: Path, base: str, tip: str, *, similarity: int) -> list[PathChange]:
    """Renamed, deleted and added files from `base` to `tip` (commits or trees) with git's rename detection at
    `similarity` percent (git's default: 50), paired over the whole tree as a 3-way merge pairs them."""
    out = run(repo, ["diff-tree", "-r", "-z", "--no-commit-id", "--name-status", f"-M{similarity}%",
                     f"-l{MERGE_RENAME_LIMIT}", "--diff-filter=ADR", base, tip, "--"]).stdout
    return _name_status(out)


def best_rename_among(repo: Path, base: str, tip: str, old: str, candidates: Sequence[str], *,
                      similarity: int) -> PathChange | None:
    """git's best rename of `old` to one of `candidates` (files of `tip`) at `similarity` percent or more, or None.

    The pathspec limits both sides of the diff, so git pairs `old` with these candidates only: the way to
    ask how well a file other than git's first choice matches (a split into near-equal candidates)."""
    if not candidates:
        return None
    out = run(repo, ["--literal-pathspecs", "diff-tree", "-r", "-z", "--no-commit-id", "--name-status",
                     f"-M{similarity}%", f"-l{MERGE_RENAME_LIMIT}", "--diff-filter=R", base, tip, "--",
                     old, *candidates]).stdout
    found = [c for c in _name_status(out) if c.old == old]
    return max(found, key=lambda c: c.similarity, default=None)


def _name_status(out: bytes) -> list[PathChange]:
    fields = [f.decode("utf-8", "surrogateescape") for f in out.split(b"\0")]
    changes: list[PathChange] = []
    i = 0
    while i < len(fields) and fields[i]:
        status = fields[i]
        if status.startswith("R"):
            changes.append(PathChange("R", fields[i + 1], fields[i + 2], int(status[1:] or 0)))
            i += 3
        else:
            kind = status[:1]
            changes.append(PathChange(kind, fields[i + 1] if kind == "D" else None,
                                      fields[i + 1] if kind == "A" else None))
            i += 2
    return changes


def checkout_detached(worktree: Path, commit: str) -> None:
    """Point a work tree's HEAD at `commit` (detached) with its index and files."""
    run(worktree, ["checkout", "--detach", "--quiet", "--force", commit])


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


# --- one walk over a whole range (upstream/rangeindex.py) --------------------------------------


def range_parents(repo: Path, base: str, tips: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """(commit, parents) of every commit reachable from `tips` but not from `base`, oldest first, parents
    before children: one walk of the whole range."""
    out = run(repo, ["rev-list", "--topo-order", "--reverse", "--parents", *tips, f"^{base}", "--"]).out
    return [(fields[0], tuple(fields[1:])) for fields in (line.split() for line in out.splitlines()) if fields]


def range_grep(repo: Path, base: str, tips: Sequence[str], grep: Sequence[str]) -> list[LogRecord]:
    """Commits of the range (reachable from `tips`, not from `base`) whose message contains any of `grep`
    literally, with their messages: one walk."""
    if not grep:
        return []
    fmt = "--format=%H%x1f%s%x1f%b%x1e"
    out = run(repo, ["log", fmt, "--fixed-strings", *(f"--grep={g}" for g in grep), *tips, f"^{base}", "--"]).out
    records = []
    for chunk in out.split("\x1e"):
        parts = chunk.strip("\n").split("\x1f")
        if len(parts) == 3 and parts[0]:
            records.append(LogRecord(parts[0], parts[1], parts[2]))
    return records


def range_touching(repo: Path, base: str, tips: Sequence[str], paths: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Non-merge commits of the range that change any of `paths`, each with the ones it changes: one walk.

    The walk lists every commit's changed files and the filter is here: git (2.39) uses the commit-graph's
    changed-path filters for one pathspec only, and matching tens of pathspecs in each tree diff costs more
    than listing the names (measured on 30,000 commits: 4.7 s with 26 pathspecs, 2.0 s without)."""
    if not paths:
        return {}
    wanted = {p.encode("utf-8", "surrogateescape") for p in paths}
    out = run(repo, ["log", "--no-merges", "--no-renames", "--format=%x1e%H", "--name-only", "-z", *tips, f"^{base}",
                     "--"]).stdout
    touched: dict[str, tuple[str, ...]] = {}
    for chunk in out.split(b"\x1e")[1:]:
        head, _, names = chunk.partition(b"\n")
        hit = tuple(n.decode("utf-8", "surrogateescape") for n in names.split(b"\0") if n.strip(b"\n") in wanted)
        if hit:
            touched[head.strip(b"\0\n").decode()] = hit
    return touched


@dataclass(frozen=True)
class BranchCommit:
    commit: str
    parents: tuple[str, ...]
    subject: str
    body: str
    paths: tuple[str, ...]  # the files it changes (none listed for a merge)


def commits_off(repo: Path, tips: Sequence[str], main: str) -> list[BranchCommit]:
    """Commits reachable from `tips` but not from `main` (release branches' own commits), newest first in
    topological order, with their messages and changed files: one walk."""
    if not tips:
        return []
    out = run(repo, ["log", "--topo-order", "--no-renames", "--name-only", "--format=%x1e%H%x1f%P%x1f%s%x1f%b%x1f",
                     *tips, f"^{main}", "--"]).out
    found = []
    for chunk in out.split("\x1e")[1:]:
        parts = chunk.split("\x1f")
        if len(parts) == 5:
            found.append(BranchCommit(parts[0], tuple(parts[1].split()), parts[2], parts[3].strip("\n"),
                                      tuple(line for line in parts[4].splitlines() if line)))
    return found


def fetch_mirror(repo: Path, on_progress: Callable[[str], None], *, blob_filter: str | None = None) -> Result:
    """`git fetch --prune --tags origin` with git's own progress lines handed to `on_progress`; with
    `blob_filter` ("blob:none") the first fetch makes `repo` a partial clone (blobs fetched when read)."""
    if blob_filter:
        run(repo, ["config", "remote.origin.promisor", "true"])
        run(repo, ["config", "remote.origin.partialclonefilter", blob_filter])
    args = ["fetch", "--progress", "--prune", "--tags", *([f"--filter={blob_filter}"] if blob_filter else []), "origin"]
    return process.stream(["git", *_STABLE_CONFIG, *args], on_progress, cwd=repo, check=False, shown=["git", *args],
                          error=GitError)


def partial_filter(repo: Path) -> str | None:
    """The filter a partial clone was made with (None: a full repository)."""
    result = run(repo, ["config", "--get", "remote.origin.partialclonefilter"], check=False)
    return result.out.strip() or None


def write_commit_graph(repo: Path) -> None:
    """A commit-graph with changed-path Bloom filters: generation numbers make --contains, merge-base and
    topological walks cheap, the filters let a path-limited walk skip most tree diffs (reused on a rewrite)."""
    run(repo, ["commit-graph", "write", "--reachable", "--changed-paths"])
