"""A kept patch whose file upstream moved: applied at the new path, proven against `git am -3`, named in the message.

The verdict followed the move (moves.py); the update applies the re-targeted patch in its tree and exports it
from there, so the patch file's diff header and index lines name the new path and the new pin's blobs. The
proof: in a scratch work tree at the same parent commit, `git am -3` of the patch as it was (old path) must
give exactly the tree the re-targeted patch gave; otherwise the update stops and changes nothing. A kept
patch's `files` probe names the new paths afterwards too: each of its keys whose file moved from the old pin
to the new one is rewritten, nothing else (the probe was validated on the new pin following those moves).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch import git
from vpatch.base import VpatchError
from vpatch.probes import Probe, ProbeKind
from vpatch.series import Patch
from vpatch.tree import Stack
from vpatch.upstream import hunkmoves, moves

if TYPE_CHECKING:
    # only in annotations: plan imports this module to re-target its rows
    from vpatch.update.plan import PatchPlan


def retargeted(patch: Patch, row: PatchPlan) -> Patch:
    """The patch at the paths the verdict followed, and with the hunks whose code moved to another file at their
    new places (hunkmoves.py); the patch itself when nothing moved."""
    out = patch
    if row.retarget:
        out = moves.retarget(patch, {old: moves.Move(old, moves.Fate.MOVED, new) for old, new in row.retarget})
    if row.relocate:
        out = hunkmoves.relocated(patch, out, {(old, n): (new, at, image) for old, n, new, at, image in row.relocate})
    return out


def prove(repo: Path, work: Path, applied: Stack, originals: Mapping[str, Patch], rows: Sequence[PatchPlan]) -> dict[str, str]:
    """file -> the proof for every applied patch that was re-targeted; raises VpatchError when `git am -3` of the
    old patch on the same parent gives other files than the re-targeted patch did."""
    moved = {r.file for r in rows if r.retarget or r.relocate}
    relocated = {r.file for r in rows if r.relocate}
    todo = [a for a in applied.applied if a.file in moved]
    if not todo:
        return {}
    scratch = work / "am-proof"
    shutil.rmtree(scratch, ignore_errors=True)
    git.forget_worktrees(repo, scratch)
    proofs: dict[str, str] = {}
    git.add_worktree(repo, scratch, applied.base)
    try:
        for entry in todo:
            parent = git.parents(applied.worktree, entry.commit)[0]
            git.checkout_detached(scratch, parent)
            result = git.am_three_way(scratch, originals[entry.file].raw)
            ours = git.tree_of(repo, entry.commit)
            theirs = git.tree_of(scratch, "HEAD") if result.returncode == 0 else None
            if theirs is None and entry.file in relocated:
                # git pairs files, not code: `git am -3` cannot place a hunk whose code went to another file.
                # The patch's probe must then tell the trees apart (validated right after, on this tree).
                if originals[entry.file].probe_path is None:
                    raise VpatchError(
                        f"{entry.file} was re-targeted where upstream moved its code (hunks to another file), but "
                        "`git am -3` of the old patch cannot apply there and the patch has no probe to prove the "
                        "result; the project is unchanged",
                        hint="give the patch a probe that fails without it and passes with it (a Probe: trailer), "
                             "or port it by hand at the new place (vpatch apply --ref NEW-PIN), then run the update "
                             "again")
                proofs[entry.file] = (f"`git am -3` of the old patch cannot place code that moved to another file; "
                                      f"its probe {originals[entry.file].trailer('Probe')} must fail on the new pin and "
                                      f"pass with the re-targeted patch (tree {ours[:12]})")
                continue
            if theirs != ours:
                why = ("`git am -3` of the old patch fails there:\n" + result.err.strip()) if theirs is None else (
                    f"`git am -3` of the old patch gives tree {theirs[:12]}, the re-targeted patch {ours[:12]}")
                raise VpatchError(f"{entry.file} was re-targeted to follow upstream's move, but the result is not proven: "
                                  f"{why}; the project is unchanged",
                                  hint="vpatch apply --ref with the new pin shows the re-targeted patch; fix the patch by "
                                       "hand at the new path, commit it, then run the update again")
            proofs[entry.file] = (f"the new pin plus the re-targeted patch gives the same files as `git am -3` of the old "
                                  f"patch (tree {ours[:12]})")
    finally:
        git.remove_worktree(repo, scratch)
        shutil.rmtree(scratch, ignore_errors=True)
    return proofs


def probe_writes(repo: Path, root: Path, rel: str, series: Sequence[Patch], *, pin: str, target: str) -> dict[str, bytes]:
    """Project path -> new content of each kept patch's `files` probe whose keys name a path that moved from
    `pin` to `target` (the patch's own files or any other the probe reads)."""

    out: dict[str, bytes] = {}
    for patch in series:
        if patch.probe_path is None:
            continue
        probe = Probe.load(patch.probe_path)
        if probe.kind is not ProbeKind.FILES:
            continue  # a behavioural probe enters through the code, wherever the file is
        named = [check.path for check in probe.files]
        found = moves.follow(repo, pin, target, moves.missing_paths(repo, pin, target, named), describe=False)
        pairs = [(old, m.new) for old, m in found.items() if m.followed and m.new]
        if not pairs:
            continue
        text = probe.raw.decode("utf-8")
        for old, new in pairs:
            # a key of the files: mapping, plain or quoted, at the start of its line
            key = re.compile(rf"^(\s*)(['\"]?){re.escape(old)}\2(\s*):", re.MULTILINE)
            text = key.sub(_renamed_key(new), text)
        if text.encode() != probe.raw:
            name = patch.probe_path.resolve().relative_to(root.resolve()).as_posix()
            out[f"{rel}/{name}" if rel else name] = text.encode()
    return out


def _renamed_key(new: str) -> Callable[[re.Match[str]], str]:
    return lambda m: f"{m[1]}{m[2]}{new}{m[2]}{m[3]}:"


def message_lines(row: PatchPlan) -> list[str]:
    """The commit message's lines under a kept patch that follows a move."""
    lines = [f"  Re-targeted: upstream moved {m}" for m in row.moves if " -> " in m]
    if row.move_proof:
        lines.append(f"  Proof: {row.move_proof}")
    return lines
