"""A kept patch's `files` probe follows its patch's code to the new pin, as the patch itself does (retarget.py).

- **Code moved to another file** (hunkmoves.py, the plan's `relocate`): a check on the file the hunks left goes
  where they went, string by string: each string goes with the hunk whose lines hold it (`contains`: the hunk's
  result, `not_contains`: the code it changes), to that hunk's new file; a string held only by hunks that stayed
  stays. A string no hunk of that file holds is not guessed: the update stops, naming it, both paths and what to do.
- **A file moved** (git's pairing, moves.py): the key is renamed to the new path.

The update validates the probe as it will be written (`validating`: the rewritten file read from the update's
folder) and then writes it with the patch (`probe_writes`). A key renamed keeps the file as it was written; a
check cut across files is written out anew (its comments are lost, a first line says so).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from vpatch.base import VpatchError
from vpatch.probes import Probe, ProbeKind
from vpatch.series import Hunk, Patch
from vpatch.update.retarget import exact_images
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
        raw, lines = _follow_hunks(probe, patch, row, name)
        probe = Probe.read(raw, path=probe.path)
    named = [check.path for check in probe.files]
    found = follow_file_moves(repo, pin, target, missing_paths(repo, pin, target, named), describe=False)
    pairs = [(old, m) for old, m in found.items() if m.followed and m.new]
    text = raw.decode("utf-8")
    for old, move in pairs:
        # a key of the files: mapping, plain or quoted, at the start of its line
        key = re.compile(rf"^(\s*)(['\"]?){re.escape(old)}\2(\s*):", re.MULTILINE)
        text, count = key.subn(_renamed_key(str(move.new)), text)
        if count:
            lines.append(f"probe check {name}: {old} -> {move.new}, the file moved (similarity {move.similarity}%)")
    if text.encode() == original and not lines:
        return None
    Probe.read(text.encode(), path=probe.path)  # what is written must read back as a probe
    return FollowedProbe(name, text.encode(), tuple(lines))


def _renamed_key(new: str) -> Callable[[re.Match[str]], str]:
    return lambda m: f"{m[1]}{m[2]}{new}{m[2]}{m[3]}:"


def _follow_hunks(probe: Probe, patch: Patch, row: PatchPlan, name: str) -> tuple[bytes, list[str]]:
    """The probe's text with each check on a file whose hunks moved (row.relocate) following them (module
    docstring), and what followed what."""
    moved: dict[str, dict[int, str]] = {}
    for old, n, new, _, _ in row.relocate:
        moved.setdefault(old, {})[n] = new
    hunks = {fd.old_path: fd.hunks for fd in patch.files if fd.old_path is not None}
    layout: dict[str, dict[str, object]] = {}  # path -> its checks, in the probe's order
    lines: list[str] = []
    renames: dict[str, str] = {}
    for check in probe.files:
        if check.path not in moved:
            _merge(layout, check.path, contains=check.contains, not_contains=check.not_contains,
                   absent_is_fix=check.absent_is_fix)
            continue
        goes = _destinations(check.path, (check.contains, check.not_contains), hunks.get(check.path, ()),
                             moved[check.path], patch, name)
        if check.absent_is_fix:
            _merge(layout, check.path, absent_is_fix=True)
        for dest, share in goes.items():
            _merge(layout, dest, contains=share.contains, not_contains=share.not_contains)
            if dest != check.path:
                said = ", ".join(str(n) for n in sorted(share.hunks))
                lines.append(f"probe check {name}: {check.path} -> {dest}, its strings followed "
                             f"hunk{'s' if len(share.hunks) > 1 else ''} {said}")
        whole = len(goes) == 1 and not check.absent_is_fix
        renames[check.path] = next(iter(goes)) if whole else ""
    keys = [c.path for c in probe.files]
    targets = [new for new in renames.values() if new]
    if all(renames.values()) and len(set(targets)) == len(targets) and not set(targets) & (set(keys) - set(renames)):
        # each check moved whole to a file no other check names: its key renamed, the rest of the file kept
        text = probe.raw.decode("utf-8")
        for old, new in renames.items():
            if new != old:
                key = re.compile(rf"^(\s*)(['\"]?){re.escape(old)}\2(\s*):", re.MULTILINE)
                text = key.sub(_renamed_key(new), text)
        if _layout(Probe.read(text.encode(), path=probe.path)) == layout:  # a key written another way: anew
            return text.encode(), lines
    return _written(probe, layout, lines), lines


def _layout(probe: Probe) -> dict[str, dict[str, object]]:
    layout: dict[str, dict[str, object]] = {}
    for check in probe.files:
        _merge(layout, check.path, contains=check.contains, not_contains=check.not_contains,
               absent_is_fix=check.absent_is_fix)
    return layout


@dataclass
class _Strings:
    """The strings of one check that go to one file, and the hunks that took them there."""

    contains: list[str] = field(default_factory=list)
    not_contains: list[str] = field(default_factory=list)
    hunks: set[int] = field(default_factory=set)


def _destinations(path: str, strings: tuple[Sequence[str], Sequence[str]], hunks: Sequence[Hunk],
                  moved: Mapping[int, str], patch: Patch, name: str) -> dict[str, _Strings]:
    """Where each string of the check on `path` (its contains, its not_contains) goes: the new file of each hunk
    holding it (`path` for a hunk that stayed) -> its strings there."""
    goes: dict[str, _Strings] = {}
    texts = [[b"".join(side).decode("utf-8", "surrogateescape") for side in exact_images(h)] for h in hunks]
    for kind, kept_strings in enumerate(strings):
        for s in kept_strings:
            # the fix is in a hunk's result (post-image), the bug in the code it changes (pre-image)
            holders = [n for n, (pre, post) in enumerate(texts, 1) if s in (post if kind == 0 else pre)]
            if not holders:
                went = ", ".join(f"hunk {n} -> {new}" for n, new in sorted(moved.items()))
                raise VpatchError(
                    f"{patch.filename}: probe {name}: the string {s!r} of its check on {path} is in none of the "
                    f"patch's hunks there ({'the result' if kind == 0 else 'the code they change'}), and upstream "
                    f"moved that file's code ({path} {went}): where the string is checked now is not guessed; "
                    "the project is unchanged",
                    hint=f"in {name}, move that string to the file that holds its code now "
                         f"({', '.join(sorted(set(moved.values())))}) or take it out, commit, and run the update again")
            for n in holders:
                share = goes.setdefault(moved.get(n, path), _Strings())
                kept = share.contains if kind == 0 else share.not_contains
                if s not in kept:
                    kept.append(s)
                share.hunks.add(n)
    return goes


def _merge(layout: dict[str, dict[str, object]], path: str, *, contains: Sequence[str] = (),
           not_contains: Sequence[str] = (), absent_is_fix: bool = False) -> None:
    entry = layout.setdefault(path, {})
    for key, strings in (("contains", contains), ("not_contains", not_contains)):
        if strings:
            have = entry.setdefault(key, [])
            assert isinstance(have, list)
            have += [s for s in strings if s not in have]
    if absent_is_fix:
        entry["absent_is_fix"] = True


def _written(probe: Probe, layout: Mapping[str, Mapping[str, object]], lines: Sequence[str]) -> bytes:
    """The probe written anew with `layout` as its files (a check cut across files has no one key to rename)."""
    import yaml  # lazy: PyYAML loads only when a probe is rewritten (status and --help never do)

    data: dict[str, object] = {"kind": "files", "files": {p: dict(spec) for p, spec in layout.items()}}
    if probe.upstream_tests is not None:
        data["upstream_tests"] = list(probe.upstream_tests)
    class Dumper(yaml.SafeDumper):
        pass

    def string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        # a string of several lines reads best with its escapes ("...\n"), as such probes are written
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"' if "\n" in value else None)

    Dumper.add_representer(str, string)
    head = "".join(f"# vpatch update: {line}\n" for line in lines)
    return (head + yaml.dump(data, Dumper=Dumper, sort_keys=False, allow_unicode=True, width=4096)).encode()


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
