"""patches/RETIRED.md: the patches dropped because upstream has them, with evidence; their numbers stay taken.

It also records narrowings: hunks dropped from a patch that stays, because upstream has them (a heading
"## NNNN-slug (narrowed)", which does not retire the number).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

RETIRED_FILE = "RETIRED.md"
_ENTRY = re.compile(r"^## (?P<number>\d{4})-(?P<slug>\S+)(?P<rest>[^\n]*)", re.M)
NARROWED = "(narrowed)"
LIVE_CHECK_FIELD = "Live-Check"
_FIELD = re.compile(r"^- (?P<key>[A-Za-z-]+): (?P<value>.*)$")
_HEADER = (
    "# Retired patches\n\n"
    "Patches dropped from the series because upstream vLLM has the change, with the evidence that decided it.\n"
    "Their numbers are never given to a new patch. Written by `vpatch update`; the last version of each file\n"
    "is in the commit named under \"Last version\". A \"(narrowed)\" entry records hunks dropped from a patch\n"
    "that stays, because upstream has them; its number stays in use.\n"
)


@dataclass(frozen=True)
class RetiredPatch:
    number: int
    slug: str
    subject: str
    applied_upstream: str  # DEP-3 Applied-Upstream: where it landed, e.g. "v0.30.0 (commit 1a2b...)"
    evidence: tuple[str, ...]
    retired_by: str  # "update v0.29.0 -> v0.30.0"
    last_version: str  # "<commit>:patches/0002-slug.patch" before it was removed
    upstream_pr: str | None = None
    # The patch's Live-Check: kept, so that a deploy can ask the new server to show what the drop claims.
    live_check: str | None = None

    @property
    def name(self) -> str:
        return f"{self.number:04d}-{self.slug}"

    def to_markdown(self) -> str:
        lines = [f"## {self.name}", "", f"- Subject: {self.subject}", f"- Applied-Upstream: {self.applied_upstream}"]
        if self.upstream_pr:
            lines.append(f"- Upstream-PR: {self.upstream_pr}")
        if self.live_check:
            lines.append(f"- {LIVE_CHECK_FIELD}: {self.live_check}")
        lines += [f"- Evidence: {e}" for e in self.evidence]
        lines += [f"- Retired-By: {self.retired_by}", f"- Last version: `git show {self.last_version}`", ""]
        return "\n".join(lines) + "\n"


def retired_numbers(patches_dir: Path) -> frozenset[int]:
    """Numbers of every patch the record lists (empty when there is no record)."""
    path = patches_dir / RETIRED_FILE
    if not path.is_file():
        return frozenset()
    return frozenset(int(m["number"]) for m in _ENTRY.finditer(path.read_text(encoding="utf-8"))
                     if m["rest"].strip() != NARROWED)


@dataclass(frozen=True)
class RetiredEntry:
    """A retired patch as the record lists it, read back: what a deploy needs about a drop."""

    number: int
    slug: str
    applied_upstream: str
    retired_by: str
    live_check: str | None  # relative to the project root

    @property
    def name(self) -> str:
        return f"{self.number:04d}-{self.slug}"


def retired_entries(patches_dir: Path) -> dict[int, RetiredEntry]:
    """Every retired (not narrowed) patch the record lists, by number; the last entry of a number wins."""
    path = patches_dir / RETIRED_FILE
    if not path.is_file():
        return {}
    text = path.read_text(encoding="utf-8")
    heads = list(_ENTRY.finditer(text))
    out: dict[int, RetiredEntry] = {}
    for i, head in enumerate(heads):
        if head["rest"].strip() == NARROWED:
            continue
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        fields: dict[str, str] = {}
        for line in text[head.end():end].splitlines():
            m = _FIELD.match(line)
            if m and m["key"] not in fields:
                fields[m["key"]] = m["value"].strip()
        number = int(head["number"])
        out[number] = RetiredEntry(number, head["slug"], fields.get("Applied-Upstream", ""),
                                   fields.get("Retired-By", ""), fields.get(LIVE_CHECK_FIELD) or None)
    return out


@dataclass(frozen=True)
class DroppedHunkRecord:
    name: str  # "path hunk N (@@ -a,b +c,d @@)" as numbered in the patch before narrowing
    applied_upstream: str  # where it first is upstream (or, Rewritten-Upstream, the commits that rewrote it)
    evidence: str
    label: str = "Applied-Upstream"  # "Rewritten-Upstream": narrowed through upstream's rewrite (update/narrow.py)


@dataclass(frozen=True)
class NarrowedPatch:
    """A patch that stays in the series, narrowed: the hunks upstream already has were dropped from it."""

    number: int
    slug: str
    subject: str
    summary: str  # "drops 1 of 3 hunks"
    dropped: tuple[DroppedHunkRecord, ...]
    kept: tuple[str, ...]
    proof: str
    probe: str
    retired_by: str  # "update v0.29.0 -> v0.30.0"
    last_version: str  # "<commit>:patches/0002-slug.patch" before it was narrowed

    def to_markdown(self) -> str:
        lines = [f"## {self.number:04d}-{self.slug} {NARROWED}", "", f"- Subject: {self.subject}",
                 f"- Narrowed: {self.summary}; the patch stays with the rest"]
        for hunk in self.dropped:
            lines += [f"- Dropped hunk: {hunk.name}", f"  - {hunk.label}: {hunk.applied_upstream}",
                      f"  - Evidence: {hunk.evidence}"]
        lines += [f"- Kept hunk: {name}" for name in self.kept]
        lines += [f"- Proof: {self.proof}", f"- Probe: {self.probe}", f"- Narrowed-By: {self.retired_by}",
                  f"- Version before: `git show {self.last_version}`", ""]
        return "\n".join(lines) + "\n"


def with_entries(current: bytes | None, entries: Sequence[RetiredPatch | NarrowedPatch]) -> bytes:
    """The record's new content: the current one (or a fresh header) with `entries` appended."""
    text = current.decode("utf-8") if current else _HEADER
    if not text.endswith("\n\n"):
        text = text.rstrip("\n") + "\n\n"
    return (text + "\n".join(e.to_markdown() for e in entries)).rstrip("\n").encode() + b"\n"
