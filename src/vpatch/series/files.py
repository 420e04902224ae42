"""Patch and Series: numbered format-patch files with DEP-3 style trailers, parsed and checked."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from email.errors import HeaderParseError
from email.header import decode_header, make_header
from pathlib import Path, PurePosixPath

from vpatch.base import SeriesError
from vpatch.series.filediff import FileDiff, parse_diff
from vpatch.series.retired import RETIRED_FILE, retired_numbers

PATCH_NAME = re.compile(r"^(?P<number>\d{4})-(?P<slug>[a-z0-9][a-z0-9._-]*)\.patch$")
_TRAILER = re.compile(r"^(?P<key>[A-Za-z][A-Za-z0-9-]*): ?(?P<value>.*)$")

# Trailers vpatch reads; DEP-3 names plus vpatch's own.
ORIGIN, BUG, FORWARDED, APPLIED_UPSTREAM, LAST_UPDATE = "Origin", "Bug", "Forwarded", "Applied-Upstream", "Last-Update"
UPSTREAM_PR, PROBE = "Upstream-PR", "Probe"
LIVE_CHECK = "Live-Check"  # a check against a running server, relative to the project root (docs/live-checks.md)


@dataclass(frozen=True)
class Patch:
    number: int
    slug: str
    path: Path
    raw: bytes
    author: str
    date: str
    subject: str
    body: str  # message after the subject, trailers included
    trailers: tuple[tuple[str, str], ...]
    diff: bytes
    files: tuple[FileDiff, ...] = field(repr=False)

    @property
    def name(self) -> str:
        return f"{self.number:04d}-{self.slug}"

    @property
    def filename(self) -> str:
        return f"{self.name}.patch"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()

    @property
    def paths(self) -> tuple[str, ...]:
        """Every path the patch reads or writes, in order, without repeats."""
        seen: dict[str, None] = {}
        for f in self.files:
            for p in (f.old_path, f.new_path):
                if p:
                    seen[p] = None
        return tuple(seen)

    def trailer(self, key: str) -> str | None:
        values = self.trailer_all(key)
        return values[-1] if values else None

    def trailer_all(self, key: str) -> list[str]:
        return [v for k, v in self.trailers if k.lower() == key.lower()]

    @property
    def upstream_pr(self) -> int | None:
        value = self.trailer(UPSTREAM_PR)
        if value and value.lstrip("#").isdigit():
            return int(value.lstrip("#"))
        return None

    @property
    def forwarded(self) -> Forwarded | None:
        """Where the patch was sent upstream (its Forwarded: trailer a URL), and the pull request's number."""
        value = self.trailer(FORWARDED)
        if not value or "://" not in value:  # "no", "not-needed": not sent
            return None
        return Forwarded(value, self.upstream_pr)

    @property
    def probe_path(self) -> Path | None:
        value = self.trailer(PROBE)
        return self.path.parent / value if value else None

    @property
    def live_check(self) -> str | None:
        """The Live-Check: trailer as written, e.g. checks/live/0003-slug.yaml (checked by `live_check_path`)."""
        return self.trailer(LIVE_CHECK)

    def live_check_path(self, root: Path) -> Path | None:
        """The live check's file in the project at `root`; None when the patch names none."""
        value = self.live_check
        return None if value is None else live_check_file(root, value, where=self.filename)

    @classmethod
    def load(cls, path: Path) -> Patch:
        match = PATCH_NAME.match(path.name)
        if not match:
            raise SeriesError(
                f"{path}: not a series file name",
                hint="patch files are named NNNN-slug.patch (four digits, lower-case slug), e.g. 0004-fix-parser.patch",
            )
        if not path.is_file():  # a FIFO or device would block or mislead the read
            raise SeriesError(f"{path}: not a regular file", hint="patch files are plain files; remove or replace it")
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise SeriesError(f"{path}: cannot read: {exc}") from exc
        return cls.parse(raw, number=int(match["number"]), slug=match["slug"], path=path)

    @classmethod
    def parse(cls, raw: bytes, *, number: int, slug: str, path: Path) -> Patch:
        start = _find_diff(raw)
        if start < 0:
            raise SeriesError(f"{path.name}: has no diff (no 'diff --git' line)",
                              hint="a patch file is the output of git format-patch: mail headers, message, then the diff")
        head, diff = raw[:start], raw[start:]
        headers, message = _split_mail(head.decode("utf-8", "surrogateescape"))
        files = parse_diff(diff, where=path.name)
        subject = headers.get("subject", "")
        body = message
        return cls(
            number=number, slug=slug, path=path, raw=raw,
            author=headers.get("from", ""), date=headers.get("date", ""),
            subject=subject, body=body, trailers=_trailers(body), diff=diff, files=files,
        )


@dataclass(frozen=True)
class Forwarded:
    """A patch sent upstream: where (Forwarded: URL) and, for a pull request, its number (Upstream-PR:)."""

    url: str
    pr: int | None = None

    def to_json(self) -> dict[str, object]:
        return {"url": self.url, "pr": self.pr}


_PULL_URL = re.compile(r"^https://github\.com/[^/\s]+/[^/\s]+/pull/(?P<number>\d+)/?(?:[#?].*)?$")


def pull_number(url: str) -> int | None:
    """The number of a GitHub pull request URL (https://github.com/OWNER/REPO/pull/N), else None."""
    match = _PULL_URL.match(url)
    return int(match["number"]) if match else None


def with_forwarded(raw: bytes, url: str, pr: int | None, *, where: str) -> bytes:
    """The patch file with `Forwarded: url` (and `Upstream-PR: pr` when given) in its trailers; every other byte as
    it was. An existing Forwarded:/Upstream-PR: line is replaced in place; a missing one goes after the last
    trailer (Upstream-PR: right after Forwarded:)."""
    start = _find_diff(raw)
    if start < 0:
        raise SeriesError(f"{where}: has no diff (no 'diff --git' line)")
    head, diff = raw[:start], raw[start:]
    lines = head.split(b"\n")
    # the trailer block: the last paragraph of the message before the diff (and format-patch's "---" line)
    end = len(lines)
    while end > 0 and lines[end - 1].strip() in (b"", b"---"):
        end -= 1
    first = end
    while first > 0 and _TRAILER.match(lines[first - 1].decode("utf-8", "surrogateescape")):
        first -= 1
    if first == end or first == 0 or lines[first - 1].strip():
        raise SeriesError(f"{where}: no DEP-3 trailer block above the diff",
                          hint="the message ends with a paragraph of `Key: value` lines (Origin:, Forwarded:, ...)")
    block = lines[first:end]

    def at(key: bytes) -> int | None:
        return next((i for i, line in enumerate(block) if line.lower().startswith(key.lower() + b":")), None)

    wanted = [(b"Forwarded", url.encode())] + ([(b"Upstream-PR", str(pr).encode())] if pr is not None else [])
    for key, value in wanted:
        line = key + b": " + value
        found, forwarded = at(key), at(b"Forwarded")
        if found is not None:
            block[found] = line
        elif key == b"Upstream-PR" and forwarded is not None:
            block.insert(forwarded + 1, line)
        else:
            block.append(line)
    return b"\n".join(lines[:first] + block + lines[end:]) + diff


@dataclass(frozen=True)
class Series:
    directory: Path
    patches: tuple[Patch, ...]
    retired: frozenset[int] = frozenset()  # numbers of patches dropped as landed (patches/RETIRED.md)
    # load(unreadable_ok=True): series files whose diff does not parse, with the error (export rewrites them)
    unreadable: tuple[tuple[str, SeriesError], ...] = ()

    @classmethod
    def load(cls, directory: Path, *, unreadable_ok: bool = False) -> Series:
        if not directory.is_dir():
            raise SeriesError(f"patches folder {directory} does not exist",
                              hint="create it (an empty folder is a valid, empty series) or fix 'patches' in vpatch.yaml")
        by_number: dict[int, Patch] = {}
        unreadable: list[tuple[str, SeriesError]] = []
        for path in sorted(directory.glob("*.patch")):
            try:
                patch = Patch.load(path)
            except SeriesError as exc:
                if not unreadable_ok or not PATCH_NAME.match(path.name) or not path.is_file():
                    raise
                unreadable.append((path.name, exc))
                continue
            if patch.number in by_number:
                raise SeriesError(
                    f"two patches share number {patch.number:04d}: {by_number[patch.number].path.name} and {path.name}",
                    hint="numbers are identities: give one of them the next free number",
                )
            by_number[patch.number] = patch

        retired = retired_numbers(directory)
        for number in sorted(retired & set(by_number)):
            raise SeriesError(
                f"{by_number[number].path.name} reuses number {number:04d}, which {RETIRED_FILE} lists as retired",
                hint="numbers are identities and a retired one is never reused: give the patch the next free number",
            )
        return cls(directory, tuple(by_number[n] for n in sorted(by_number)), retired, tuple(unreadable))

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.patches)

    def __len__(self) -> int:
        return len(self.patches)

    def next_number(self, retired: set[int] = frozenset()) -> int:  # type: ignore[assignment]
        used = {p.number for p in self.patches} | set(retired) | set(self.retired) | {int(n[:4]) for n, _ in self.unreadable}
        return max(used, default=0) + 1

    def get(self, key: str) -> Patch:
        """A patch by number ("2", "0002") or name ("0002-slug")."""
        for p in self.patches:
            if key in (p.name, p.filename, p.slug) or (key.isdigit() and int(key) == p.number):
                return p
        raise SeriesError(f"no patch {key!r} in {self.directory}",
                          hint="vpatch status lists the patches by number")


def stray_files(directory: Path) -> list[str]:
    """Files in the patches folder that look like patches but are not part of the series (never applied)."""
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if p.name.endswith((".diff", ".orig", ".rej")))


def slugify(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:52].rstrip("-") or "patch"


def live_check_file(root: Path, value: str, *, where: str) -> Path:
    """A Live-Check: value as a file of the project: relative, inside it, a .yaml file."""
    pure = PurePosixPath(value)
    if not value or pure.is_absolute() or ".." in pure.parts or pure.suffix not in (".yaml", ".yml"):
        raise SeriesError(f"{where}: Live-Check: {value!r} is not a .yaml file inside the project",
                          hint="write it relative to the project root, e.g. Live-Check: checks/live/0003-slug.yaml")
    return root / pure


def _find_diff(raw: bytes) -> int:
    if raw.startswith(b"diff --git "):
        return 0
    return raw.find(b"\ndiff --git ") + 1 or -1


def _split_mail(head: str) -> tuple[dict[str, str], str]:
    """Mail headers (lower-case keys, decoded) and the message body before the diff."""
    lines = head.split("\n")
    headers: dict[str, str] = {}
    i = 0
    if lines and lines[0].startswith("From "):
        i = 1
    key = None
    while i < len(lines) and lines[i].strip():
        line = lines[i]
        if line[:1] in (" ", "\t") and key:
            headers[key] += " " + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            headers[key] = value.strip()
        else:
            break
        i += 1
    for k, v in headers.items():
        if "=?" not in v:
            continue
        # RFC 2047 encoded words; the email package is only loaded for them

        try:
            headers[k] = str(make_header(decode_header(v)))
        except (HeaderParseError, LookupError, UnicodeError, ValueError):
            pass  # a malformed encoded word stays as written
    body = "\n".join(lines[i + 1:])
    # format-patch ends the message with a "---" line before the diff (and stat, when present)
    cut = body.rfind("\n---\n")
    if cut >= 0:
        body = body[:cut + 1]
    elif body.startswith("---\n"):
        body = ""
    return headers, body.strip("\n") + ("\n" if body.strip() else "")


def _trailers(body: str) -> tuple[tuple[str, str], ...]:
    paragraphs = [p for p in body.strip().split("\n\n") if p.strip()]
    if not paragraphs:
        return ()
    last = paragraphs[-1].splitlines()
    pairs = []
    for line in last:
        m = _TRAILER.match(line)
        if not m:
            return ()
        pairs.append((m["key"], m["value"].strip()))
    return tuple(pairs)
