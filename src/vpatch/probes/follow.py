"""A `files` probe follows its patch's code where upstream moved it to another file: one rule for `status` (the
Witness runs the probe as followed on that commit) and `update` (which writes it so, update/probefollow.py).

A check on a file whose hunks moved (hunkmoves.py) goes where they went, string by string: each string goes with
the hunk whose lines hold it (`contains`: the hunk's result, `not_contains`: the code it changes), to that hunk's
new file; a string held only by hunks that stayed stays. A string no hunk of that file holds is not guessed: a
ProbeError names it, both paths and what to do. Each check that moved whole keeps the probe's text, its key
renamed; a check cut across files is written out anew (its comments are lost, a first line says so).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vpatch.probes.file import Probe, ProbeError
from vpatch.probes.outcome import ProbeKind
from vpatch.series import Hunk, Patch, exact_images

# (a path of the pin the patch changes, its hunk's number there, from 1) -> the file that hunk's code is in now
Moved = Mapping[tuple[str, int], str]


@dataclass(frozen=True)
class Followed:
    """One check of a probe that followed hunks to another file."""

    old: str
    new: str
    hunks: tuple[int, ...]

    def __str__(self) -> str:
        said = ", ".join(str(n) for n in self.hunks)
        return f"{self.old} -> {self.new}, its strings followed hunk{'s' if len(self.hunks) > 1 else ''} {said}"


@dataclass(frozen=True)
class FollowedStrings:
    """A probe's text with its checks where its patch's code went, and what went where."""

    raw: bytes
    moves: tuple[Followed, ...]


def follow_strings(probe: Probe, patch: Patch, moved: Moved, *, name: str) -> FollowedStrings | None:
    """`probe` (its patch `patch` as written on the pin) with each check on a file whose hunks moved (`moved`)
    following them (the module docstring); None when it is no `files` probe or none of its checks names such a
    file. Raises ProbeError for a string whose place cannot be told."""
    olds = {old for old, _ in moved}
    if probe.kind is not ProbeKind.FILES or not any(check.path in olds for check in probe.files):
        return None
    by_old: dict[str, dict[int, str]] = {}
    for (old, n), new in moved.items():
        by_old.setdefault(old, {})[n] = new
    hunks = {fd.old_path: fd.hunks for fd in patch.files if fd.old_path is not None}
    layout: dict[str, dict[str, object]] = {}  # path -> its checks, in the probe's order
    went: list[Followed] = []
    renames: dict[str, str] = {}
    for check in probe.files:
        if check.path not in by_old:
            _merge(layout, check.path, contains=check.contains, not_contains=check.not_contains,
                   absent_is_fix=check.absent_is_fix)
            continue
        goes = _destinations(check.path, (check.contains, check.not_contains), hunks.get(check.path, ()),
                             by_old[check.path], patch, name)
        if check.absent_is_fix:
            _merge(layout, check.path, absent_is_fix=True)
        for dest, share in goes.items():
            _merge(layout, dest, contains=share.contains, not_contains=share.not_contains)
            if dest != check.path:
                went.append(Followed(check.path, dest, tuple(sorted(share.hunks))))
        whole = len(goes) == 1 and not check.absent_is_fix
        renames[check.path] = next(iter(goes)) if whole else ""
    keys = [c.path for c in probe.files]
    targets = [new for new in renames.values() if new]
    if all(renames.values()) and len(set(targets)) == len(targets) and not set(targets) & (set(keys) - set(renames)):
        # each check moved whole to a file no other check names: its key renamed, the rest of the file kept
        text = probe.raw.decode("utf-8")
        for old, new in renames.items():
            if new != old:
                text = rename_key(text, old, new)[0]
        if _layout(Probe.read(text.encode(), path=probe.path)) == layout:  # a key written another way: anew
            return FollowedStrings(text.encode(), tuple(went))
    return FollowedStrings(_written(probe, layout, [f"probe check {name}: {m}" for m in went]), tuple(went))


def rename_key(text: str, old: str, new: str) -> tuple[str, int]:
    """A probe's text with the key `old` of its files: mapping (plain or quoted, at the start of its line) named
    `new`, and how many keys were renamed."""
    key = re.compile(rf"^(\s*)(['\"]?){re.escape(old)}\2(\s*):", re.MULTILINE)
    return key.subn(lambda m: f"{m[1]}{m[2]}{new}{m[2]}{m[3]}:", text)


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
                raise ProbeError(
                    f"{patch.filename}: probe {name}: the string {s!r} of its check on {path} is in none of the "
                    f"patch's hunks there ({'the result' if kind == 0 else 'the code they change'}), and upstream "
                    f"moved that file's code ({path} {went}): where the string is checked now is not guessed",
                    hint=f"in {name}, move that string to the file that holds its code now "
                         f"({', '.join(sorted(set(moved.values())))}) or take it out")
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
    import yaml  # lazy: PyYAML loads only when a probe's check is cut across files (--help never does)

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
