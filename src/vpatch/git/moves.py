"""Rename detection: where a file went between two commits, paired as a 3-way merge pairs them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vpatch.git.core import run

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


def files_containing(repo: Path, treeish: str, needles: Sequence[bytes], *,
                     suffixes: Sequence[str] = ()) -> dict[str, set[bytes]]:
    """Path -> which of `needles` (fixed strings) its lines hold, for the files of `treeish` that hold any: where
    pieces of code went when git's file pairing cannot say (hunks re-targeted across a split). One walk of the
    tree for all of them; `suffixes` (".py"): only files whose names end so (a third less to read in vLLM)."""
    if not needles:
        return {}
    args = ["grep", "-F", "-I", "-o", "-z", "--no-color", "--full-name"]
    for needle in needles:
        args += ["-e", needle.decode("utf-8", "surrogateescape")]
    spec = [f"*{s}" for s in suffixes if s and not any(c in s for c in "*?[]\\:")]
    result = run(repo, [*args, treeish, "--", *spec], check=False)
    if result.returncode not in (0, 1):  # 1: no file holds any of them
        run(repo, [*args, treeish, "--", *spec])  # raises, naming the command and its output
    out: dict[str, set[bytes]] = {}
    prefix = f"{treeish}:".encode()
    for line in result.stdout.split(b"\n"):
        name, _, match = line.partition(b"\0")
        if match:
            out.setdefault(name.removeprefix(prefix).decode("utf-8", "surrogateescape"), set()).add(match)
    return out
