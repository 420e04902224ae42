"""patches/RETIRED.md: the patches dropped because upstream has them, with evidence; their numbers stay taken."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RETIRED_FILE = "RETIRED.md"
_ENTRY = re.compile(r"^## (?P<number>\d{4})-(?P<slug>\S+)", re.M)
_HEADER = (
    "# Retired patches\n\n"
    "Patches dropped from the series because upstream vLLM has the change, with the evidence that decided it.\n"
    "Their numbers are never given to a new patch. Written by `vpatch update`; the last version of each file\n"
    "is in the commit named under \"Last version\".\n"
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

    @property
    def name(self) -> str:
        return f"{self.number:04d}-{self.slug}"

    def to_markdown(self) -> str:
        lines = [f"## {self.name}", "", f"- Subject: {self.subject}", f"- Applied-Upstream: {self.applied_upstream}"]
        if self.upstream_pr:
            lines.append(f"- Upstream-PR: {self.upstream_pr}")
        lines += [f"- Evidence: {e}" for e in self.evidence]
        lines += [f"- Retired-By: {self.retired_by}", f"- Last version: `git show {self.last_version}`", ""]
        return "\n".join(lines) + "\n"


def retired_numbers(patches_dir: Path) -> frozenset[int]:
    """Numbers of every patch the record lists (empty when there is no record)."""
    path = patches_dir / RETIRED_FILE
    if not path.is_file():
        return frozenset()
    return frozenset(int(m["number"]) for m in _ENTRY.finditer(path.read_text(encoding="utf-8")))


def with_entries(current: bytes | None, entries: list[RetiredPatch]) -> bytes:
    """The record's new content: the current one (or a fresh header) with `entries` appended."""
    text = current.decode("utf-8") if current else _HEADER
    if not text.endswith("\n\n"):
        text = text.rstrip("\n") + "\n\n"
    return (text + "\n".join(e.to_markdown() for e in entries)).rstrip("\n").encode() + b"\n"
