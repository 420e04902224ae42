"""The file contents a status will read on a partial mirror, found before it reads them and fetched in one request.

What status reads (the rest of its git calls read commits and trees, which a partial mirror has): the patches'
files at the pin, at each target and at every bisection step (`cat-file --batch`, `apply --cached` in a temporary
index; a 3-way apply starts from the pin's blob the patch names), and both sides of every commit in the range that
changes one of them (one `log -p` for the patch-ids). Every such blob is the patches' file at the pin, at a target,
or at a commit of the range that changes it or at that commit's parent: a bisection step's version of a file is the
one the last commit changing it left. So those commits' trees, read for the patches' paths only, name them all.
Outside that set, and fetched by git as it reads them: a landing commit's other files (its whole diff is read
for the cherry-pick search), release-branch commits outside the range, and rename detection, which git batches
itself (one fetch per diff).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vpatch import git
from vpatch.base import Reporter, silent
from vpatch.upstream import mirror, rangeindex


def prefetch_for_status(repo: Path, pin: str, targets: Sequence[str], paths: Sequence[str], *, history: bool,
               report: Reporter = silent) -> int:
    """Fetch what a status of `paths` from `pin` to `targets` will read and the partial mirror `repo` lacks, in one
    request; returns how many blobs that was (0 on a full mirror, or when an earlier status fetched them)."""
    if not paths or git.partial_filter(repo) is None:
        return 0
    ends = sorted({pin, *targets})
    missing = git.missing_blobs(repo, ends, paths)
    if not missing:
        # an earlier status fetched the range's versions with these: no walk of the range to find them again
        return 0
    declared = rangeindex.read_declared(repo, pin) if history else None
    if declared is not None:
        wanted = set(paths)
        changing = [c for c, names in declared.touched.items() if wanted.intersection(names)]
        commits = sorted({*ends, *changing, *(p for c in changing for p in declared.parents.get(c, ())[:1])})
        missing = git.missing_blobs(repo, commits, paths)
    mirror.prefetch(repo, missing, report=report)
    return len(missing)
