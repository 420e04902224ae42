"""A kept patch whose file or code upstream moved: applied at the new place, proven, named in the message.

The verdict followed the move (moves.py: a file git pairs; hunkmoves.py: code gone to another file); the update
applies the re-targeted patch in its tree and exports it from there, so the patch file's diff header and index
lines name the new path and the new pin's blobs. The proof, in a scratch work tree at the same parent commit:
`git am -3` of the patch as it was (old path) gives exactly the tree the re-targeted patch gave; or, for code gone
to another file (which `git am -3` cannot place: it pairs files), the relocation is exact: the rest of the patch
by `git am -3`, each moved hunk's whole pre-image at exactly one place of its new file, replaced by its
post-image, give that tree; or else the patch's probe must tell the two trees apart. Otherwise the update stops
and changes nothing. A kept patch's `files` probe follows too (probefollow.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch import git
from vpatch.base import VpatchError
from vpatch.series import LAST_UPDATE, Hunk, Patch, exact_images, file_lines, hunk_name
from vpatch.tree import Stack
from vpatch.update import narrow
from vpatch.upstream import Fate, Move, relocated_patch, retarget_paths

if TYPE_CHECKING:
    # only in annotations: plan imports this module to re-target its rows
    from vpatch.update.plan import PatchPlan


def retargeted(patch: Patch, row: PatchPlan) -> Patch:
    """The patch at the paths the verdict followed, and with the hunks whose code moved to another file at their
    new places (hunkmoves.py); the patch itself when nothing moved."""
    out = patch
    if row.retarget:
        out = retarget_paths(patch, {old: Move(old, Fate.MOVED, new) for old, new in row.retarget})
    if row.relocate:
        out = relocated_patch(patch, out, {(old, n): (new, at, image) for old, n, new, at, image in row.relocate})
    return out


def prove(repo: Path, work: Path, applied: Stack, originals: Mapping[str, Patch], rows: Sequence[PatchPlan]) -> dict[str, str]:
    """file -> the proof for every applied patch that was re-targeted (`_proof`); raises VpatchError, the project
    unchanged, for the first whose result nothing proves."""
    by_file = {r.file: r for r in rows if r.retarget or r.relocate}
    return prove_steps(repo, work, applied.base, [
        (git.parents(applied.worktree, entry.commit)[0], git.tree_of(repo, entry.commit), originals[entry.file],
         by_file[entry.file]) for entry in applied.applied if entry.file in by_file])


# (the parent commit, the tree of the re-targeted patch on it, the patch as it was, its row of the plan)
Step = tuple[str, str, Patch, "PatchPlan"]


def prove_steps(repo: Path, work: Path, base: str, todo: Sequence[Step]) -> dict[str, str]:
    """`prove` for the given steps, in a scratch work tree of the mirror under `work` (removed after); the dry
    run gives its steps as commits built in memory (`git.scratch_commit`)."""
    if not todo:
        return {}
    scratch = work / "am-proof"
    shutil.rmtree(scratch, ignore_errors=True)
    git.forget_worktrees(repo, scratch)
    git.add_worktree(repo, scratch, base)
    try:
        return {row.file: _proof(repo, scratch, parent, ours, old, row) for parent, ours, old, row in todo}
    finally:
        git.remove_worktree(repo, scratch)
        shutil.rmtree(scratch, ignore_errors=True)


def _proof(repo: Path, scratch: Path, parent: str, ours: str, old: Patch, row: PatchPlan) -> str:
    """Why `ours` (the tree of the re-targeted patch on `parent`) is the old patch's result: `git am -3` of the old
    patch gives it; else, for code that moved to another file, the exact relocation gives it, or the patch's probe
    will have to tell (validated right after, on this tree); else VpatchError."""
    git.checkout_detached(scratch, parent)
    result = git.am_three_way(scratch, old.raw)
    theirs = git.tree_of(scratch, "HEAD") if result.returncode == 0 else None
    if theirs == ours:
        return (f"the new pin plus the re-targeted patch gives the same files as `git am -3` of the old patch "
                f"(tree {ours[:12]})")
    if row.relocate:
        # git pairs files, not code: `git am -3` cannot place a hunk whose code went to another file
        git.checkout_detached(scratch, parent)
        exact, why = _exact_relocation(repo, scratch, old, row, ours)
        if exact:
            return exact
        if old.probe_path is None:
            raise VpatchError(
                f"{old.filename} was re-targeted where upstream moved its code (hunks to another file), but "
                f"`git am -3` of the old patch cannot apply there, the relocation is not exact ({why}), and the "
                "patch has no probe to prove the result; the project is unchanged",
                hint="port it by hand at the new place (vpatch apply --ref NEW-PIN shows the re-targeted patch), or "
                     "give the patch a probe that fails without it and passes with it (a Probe: trailer), then run "
                     "the update again")
        return (f"`git am -3` of the old patch cannot place code that moved to another file and the relocation is "
                f"not exact ({why}); its probe {old.trailer('Probe')} must fail on the new pin and pass with the "
                f"re-targeted patch (tree {ours[:12]})")
    why = ("`git am -3` of the old patch fails there:\n" + result.err.strip()) if theirs is None else (
        f"`git am -3` of the old patch gives tree {theirs[:12]}, the re-targeted patch {ours[:12]}")
    raise VpatchError(f"{old.filename} was re-targeted to follow upstream's move, but the result is not proven: "
                      f"{why}; the project is unchanged",
                      hint="vpatch apply --ref with the new pin shows the re-targeted patch; fix the patch by "
                           "hand at the new path, commit it, then run the update again")


def _exact_relocation(repo: Path, scratch: Path, old: Patch, row: PatchPlan, ours: str) -> tuple[str, str]:
    """(the proof, "") when the relocation is exact, else ("", why not). Exact: on the scratch tree (the parent),
    `git am -3` of the old patch without its relocated hunks applies (nothing to apply: nothing run), then each
    relocated hunk's whole pre-image (context and removed lines, byte for byte) is at exactly one place of its new
    file and is replaced there by its post-image (a hunk found already changed: its post-image at exactly one
    place), and the files that gives are exactly the re-targeted patch's tree `ours`. The search's answer is not
    trusted: where it found the code is not used, only the hunk's own text and the file it names."""
    moved = {(o, n): (new, image) for o, n, new, _, image in row.relocate}
    placed = [(path, n, hunk, *moved[(path, n)]) for fd in old.files if (path := fd.old_path) is not None
              for n, hunk in enumerate(fd.hunks, 1) if (path, n) in moved]
    if len(placed) != len(moved):
        return "", "the plan names hunks the patch does not have"
    total = sum(len(fd.hunks) for fd in old.files)
    if total > len(placed):
        drop = [hunk_name(fd, n, h) for fd in old.files for n, h in enumerate(fd.hunks, 1)
                if (fd.old_path, n) in moved]
        rest = narrow.narrowed_patch(old, drop, old.trailer(LAST_UPDATE) or "unknown")
        result = git.am_three_way(scratch, rest.raw)
        if result.returncode != 0:
            return "", ("`git am -3` of the old patch without its relocated hunks fails there: "
                        + (result.err.strip().splitlines() or ["no output"])[0])
    texts = git.read_blobs(scratch, "HEAD", sorted({p[3] for p in placed}))
    where = []
    for path, n, hunk, new, image in placed:
        text = texts.get(new)
        if text is None:
            return "", f"{path} hunk {n}: {new} is not on the new pin"
        done, said = _placed(text, hunk, image)
        if done is None:
            return "", f"{path} hunk {n} -> {new}: {said}"
        texts[new] = done
        where.append(f"{path} hunk {n} -> {new} line {said}")
    tree = git.tree_with(repo, git.head(scratch), {p: t for p, t in texts.items() if t is not None}, [])
    if tree != ours:
        return "", f"that gives tree {tree[:12]}, the re-targeted patch {ours[:12]}"
    return (f"`git am -3` of the old patch cannot place code that moved to another file; the relocation is exact: "
            f"{'; '.join(where)}, each hunk's whole pre-image (context and removed lines, byte for byte) at exactly "
            f"one place there and replaced by its post-image, "
            + ("the rest of the patch by `git am -3`, " if total > len(placed) else "")
            + f"gives the re-targeted patch's tree {ours[:12]}"), ""


def _placed(text: bytes, hunk: Hunk, image: str) -> tuple[bytes | None, str]:
    """`text` with the hunk made at the one place its pre-image is, and that line ("12", or "12 (already changed
    there)" for a hunk whose post-image is there); (None, why) when the image is at no place or at several."""
    pre, post = exact_images(hunk)
    want = post if image == "post" else pre
    lines = file_lines(text)
    size = len(want)
    if not size:
        return None, "it has no lines to find"
    at = [i for i in range(len(lines) - size + 1) if lines[i] == want[0] and lines[i:i + size] == want]
    name = "post-image (the change made)" if image == "post" else "pre-image (context and removed lines)"
    if not at:
        return None, f"its whole {name} is not in it byte for byte"
    if len(at) > 1:
        return None, f"its whole {name} is at {len(at)} places of it (lines {', '.join(str(i + 1) for i in at)})"
    if image == "post":
        return text, f"{at[0] + 1} (already changed there)"
    return b"".join([*lines[:at[0]], *post, *lines[at[0] + size:]]), str(at[0] + 1)


def message_lines(row: PatchPlan) -> list[str]:
    """The commit message's lines under a kept patch that follows a move."""
    lines = [f"  Re-targeted: upstream moved {m}" for m in row.moves if " -> " in m]
    if row.move_proof:
        lines.append(f"  Proof: {row.move_proof}")
    lines += [f"  Probe followed: {m}" for m in row.probe_moves]
    return lines
