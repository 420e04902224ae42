"""A kept patch's `files` probe follows its patch's code to the new pin, as the patch itself does (retarget.py).

- **Code moved to another file** (hunkmoves.py, the plan's `relocate`): a check on the file the hunks left goes
  where they went, string by string, by the rule `status` runs it with too (probes/follow.py); a string no hunk of
  that file holds is not guessed: the update stops, naming it, both paths and what to do.
- **A file moved** (git's pairing, moves.py): the key is renamed to the new path.

The update validates the probe as it will be written (`validating`: the rewritten file read from the update's
folder) and then writes it with the patch (`probe_writes`). A key renamed keeps the file as it was written; a
check cut across files is written out anew (its comments are lost, a first line says so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from vpatch.base import VpatchError
from vpatch.probes import Probe, ProbeKind, follow_strings, rename_key
from vpatch.series import Patch
from vpatch.upstream import follow_file_moves, missing_paths

if TYPE_CHECKING:
    from vpatch.update.plan import PatchPlan

_FOLDER = "followed-probes"  # under the update's folder: the rewritten probes the update validates


@dataclass(frozen=True)
class FollowedProbe:
    """A `files` probe rewritten to where its patch's code is on the new pin."""

    trailer: str  # the patch's Probe: trailer (relative to the patches folder)
    raw: bytes  # the probe as it will be written
    lines: tuple[str, ...]  # each check that followed, in words


def followed(repo: Path, patch: Patch, row: PatchPlan | None, *, pin: str, target: str) -> FollowedProbe | None:
    """`patch`'s `files` probe with its checks where the code went from `pin` to `target` (None: no `files` probe,
    or nothing of it moved). Raises VpatchError for a string whose place cannot be told."""
    if patch.probe_path is None or not patch.probe_path.is_file():
        return None  # no probe to follow (a missing file is the validation's error, said there)
    probe = Probe.load(patch.probe_path)
    if probe.kind is not ProbeKind.FILES:
        return None  # a behavioural probe enters through the code, wherever the file is
    name = patch.trailer("Probe") or probe.name
    original = raw = probe.raw
    lines: list[str] = []
    if row is not None and row.relocate:
        try:
            found_strings = follow_strings(probe, patch, {(old, n): new for old, n, new, _, _ in row.relocate},
                                           name=name)
        except VpatchError as exc:
            raise VpatchError(f"{exc.message}; the project is unchanged",
                              hint=f"{exc.hint or 'fix the probe'}, commit, and run the update again") from exc
        if found_strings is not None:
            raw = found_strings.raw
            lines += [f"probe check {name}: {m}" for m in found_strings.moves]
            probe = Probe.read(raw, path=probe.path)
    named = [check.path for check in probe.files]
    found = follow_file_moves(repo, pin, target, missing_paths(repo, pin, target, named), describe=False)
    pairs = [(old, m) for old, m in found.items() if m.followed and m.new]
    text = raw.decode("utf-8")
    for old, move in pairs:
        text, count = rename_key(text, old, str(move.new))
        if count:
            lines.append(f"probe check {name}: {old} -> {move.new}, the file moved (similarity {move.similarity}%)")
    if text.encode() == original and not lines:
        return None
    Probe.read(text.encode(), path=probe.path)  # what is written must read back as a probe
    return FollowedProbe(name, text.encode(), tuple(lines))


def validating(work: Path, patch: Patch, probe: FollowedProbe) -> Patch:
    """`patch` (as the update applies it) reading its probe as rewritten: the file is written under the update's
    folder `work`, where the patch is read from (the project's probe is written only with the update's commit)."""
    ups = sum(part == ".." for part in PurePosixPath(probe.trailer).parts)
    folder = work / _FOLDER / Path(*(["up"] * ups)) if ups else work / _FOLDER
    dest = folder / probe.trailer
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(probe.raw)
    return replace(patch, path=folder / patch.filename)


def probe_writes(repo: Path, root: Path, rel: str, series: Sequence[Patch], rows: Mapping[str, PatchPlan], *,
                 pin: str, target: str) -> dict[str, bytes]:
    """Project path -> new content of each kept patch's `files` probe that follows its code or its files from
    `pin` to `target` (`followed`; `rows`: file -> its row of the plan)."""
    out: dict[str, bytes] = {}
    for patch in series:
        found = followed(repo, patch, rows.get(patch.filename), pin=pin, target=target)
        if found is None or patch.probe_path is None:
            continue
        name = patch.probe_path.resolve().relative_to(root.resolve()).as_posix()
        out[f"{rel}/{name}" if rel else name] = found.raw
    return out
