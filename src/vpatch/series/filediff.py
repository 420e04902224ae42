"""A git diff split into files and hunks, every hunk header and line count checked, and the paths it touches
refused when they would leave the tree: the diff of a series file, and any other diff vpatch reads."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from vpatch.base import SeriesError

# a hunk header: old start, old count, new start, new count (a count left out is 1)
HUNK_HEADER = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_C_ESCAPES = {ord("a"): 7, ord("b"): 8, ord("t"): 9, ord("n"): 10, ord("v"): 11, ord("f"): 12, ord("r"): 13,
              ord('"'): ord('"'), ord("\\"): ord("\\")}


@dataclass(frozen=True)
class Hunk:
    header: str  # the "@@ -a,b +c,d @@ ..." line
    text: bytes  # header line plus body lines


@dataclass(frozen=True)
class FileDiff:
    old_path: str | None  # None: file is created
    new_path: str | None  # None: file is deleted
    header: bytes  # "diff --git" line through the "+++" line (or the whole block for mode-only/binary)
    hunks: tuple[Hunk, ...]
    binary: bool = False

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""

    @property
    def text(self) -> bytes:
        return self.header + b"".join(h.text for h in self.hunks)


def hunk_name(fd: FileDiff, n: int, hunk: Hunk) -> str:
    """How every message names a hunk: 'vllm/x.py hunk 2 (@@ -20,8 +21,7 @@)' (n counts from 1 in its file)."""
    return f"{fd.path} hunk {n} ({hunk.header.split(' @@')[0]} @@)"


def file_lines(data: bytes) -> list[bytes]:
    """`data` cut after each newline (git's lines: a lone carriage return is part of its line)."""
    parts = data.split(b"\n")
    out = [p + b"\n" for p in parts[:-1]]
    return [*out, parts[-1]] if parts[-1] else out


def exact_images(hunk: Hunk) -> tuple[list[bytes], list[bytes]]:
    """The hunk's pre-image and post-image as the file's lines, newlines kept ("\\ No newline at end of file"
    taken off the line before it)."""
    pre: list[bytes] = []
    post: list[bytes] = []
    last: tuple[list[bytes], ...] = ()
    for line in file_lines(hunk.text)[1:]:
        tag, body = line[:1], line[1:]
        if tag == b"\\":
            for side in last:
                side[-1] = side[-1].removesuffix(b"\n")
            continue
        if line in (b"\n", b"\r\n"):  # a blank context line written without its space
            tag, body = b" ", line
        last = {b" ": (pre, post), b"-": (pre,), b"+": (post,)}.get(tag, ())
        for side in last:
            side.append(body)
    return pre, post


def check_path(path: str, where: str) -> None:
    """Refuse paths that would write outside the tree or into git's own folder."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise SeriesError(f"{where}: touches a path that is not UTF-8: {path.encode('utf-8', 'surrogateescape')!r}",
                          hint="vpatch handles UTF-8 file names only; rename the file") from None
    pure = PurePosixPath(path)
    if pure.is_absolute() or path.startswith("\\") or re.match(r"^[A-Za-z]:", path):
        raise SeriesError(f"{where}: touches an absolute path {path!r}", hint="paths in a patch are relative to the tree root")
    if ".." in pure.parts:
        raise SeriesError(f"{where}: touches {path!r}, outside the tree", hint="remove the '..' path from the patch")
    if any(part.lower() == ".git" for part in pure.parts):
        raise SeriesError(f"{where}: touches {path!r} inside the .git folder", hint="patches may only change tracked files")


def parse_diff(diff: bytes, *, where: str) -> tuple[FileDiff, ...]:
    """Split a git diff into files and hunks, checking every hunk header and line count."""
    lines = diff.splitlines(keepends=True)
    files: list[FileDiff] = []
    i = 0
    last_hunk: int | None = None  # where the last hunk read starts
    while i < len(lines):
        line = lines[i]
        if not line.startswith(b"diff --git "):
            if line == b"-- \n":
                break  # git's mail signature ("-- " then its version) ends the diff
            if not line.strip():
                i += 1  # blank lines after the last hunk
                continue
            if last_hunk is not None and line[:1] in (b" ", b"-", b"+"):
                # a diff line right after a hunk: the hunk's header counts fewer lines than it has
                raise SeriesError(f"{where}: line {i + 1} of the diff follows hunk {lines[last_hunk].strip()[:60]!r} "
                                  "but its header does not count it", hint=_recount_hint(lines, last_hunk))
            raise SeriesError(f"{where}: unexpected line {i + 1} of the diff: {line[:60]!r}",
                              hint="regenerate the patch with vpatch export or git format-patch")
        header = [line]
        old, new = _diff_git_paths(line.rstrip(b"\n")[len(b"diff --git "):], where)
        named = old is not None
        i += 1
        binary = False
        while i < len(lines) and not lines[i].startswith((b"@@", b"diff --git ")):
            text = lines[i]
            header.append(text)
            value = text.rstrip(b"\n")
            if text.startswith(b"--- "):
                old = None if value == b"--- /dev/null" else _strip_prefix(_header_path(value[4:], where), "a/")
                named = True
            elif text.startswith(b"+++ "):
                new = None if value == b"+++ /dev/null" else _strip_prefix(_header_path(value[4:], where), "b/")
                named = True
            elif text.startswith((b"rename from ", b"copy from ")):
                old, named = _header_path(value.split(b" ", 2)[2], where), True
            elif text.startswith((b"rename to ", b"copy to ")):
                new, named = _header_path(value.split(b" ", 2)[2], where), True
            elif text.startswith(b"new file mode"):
                old = None
            elif text.startswith(b"deleted file mode"):
                new = None
            elif text.startswith((b"GIT binary patch", b"Binary files")):
                binary = True
            i += 1
        if not named:
            raise SeriesError(f"{where}: cannot tell the file names in {line.rstrip()[:80]!r}",
                              hint="regenerate the patch with vpatch export or git format-patch")
        for p in (old, new):
            if p is not None:
                check_path(p, where)
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith(b"@@"):
            last_hunk = i
            hunk, i = _read_hunk(lines, i, where, new or old or "")
            hunks.append(hunk)
        metadata_only = (b"new file", b"deleted file", b"old mode", b"rename", b"similarity")
        if not hunks and not binary and not any(h.startswith(metadata_only) for h in header):
            raise SeriesError(f"{where}: the diff of {new or old} has no hunks", hint="regenerate the patch with vpatch export")
        files.append(FileDiff(old, new, b"".join(header), tuple(hunks), binary))
    if not files:
        raise SeriesError(f"{where}: has no diff", hint="a patch needs at least one changed file")
    return tuple(files)


def _read_hunk(lines: list[bytes], i: int, where: str, path: str) -> tuple[Hunk, int]:
    m = HUNK_HEADER.match(lines[i])
    if not m:
        raise SeriesError(f"{where}: broken hunk header in {path}: {lines[i].strip()[:60]!r}",
                          hint="a hunk header looks like '@@ -12,7 +12,8 @@'; regenerate the patch")
    old_left = int(m[2]) if m[2] is not None else 1
    new_left = int(m[4]) if m[4] is not None else 1
    start = i
    i += 1
    header_text = lines[start].strip().decode(errors="replace")
    while old_left > 0 or new_left > 0:
        if i >= len(lines):
            raise SeriesError(f"{where}: hunk {header_text} in {path} is cut short",
                              hint="the hunk header counts more lines than the hunk has; " + _recount_hint(lines, start))
        tag = lines[i][:1]
        if tag in (b" ", b"\n"):
            old_left -= 1
            new_left -= 1
        elif tag == b"-":
            old_left -= 1
        elif tag == b"+":
            new_left -= 1
        elif tag != b"\\":
            raise SeriesError(f"{where}: hunk {header_text} in {path} has a bad line {lines[i][:60]!r}",
                              hint="the hunk header counts do not match its lines; " + _recount_hint(lines, start))
        i += 1
        if old_left < 0 or new_left < 0:
            raise SeriesError(f"{where}: hunk {header_text} in {path} is longer than its header says",
                              hint=_recount_hint(lines, start))
    while i < len(lines) and lines[i].startswith(b"\\"):
        i += 1
    header = lines[start].rstrip(b"\n").decode("utf-8", "replace")
    return Hunk(header, b"".join(lines[start:i])), i


def _recount_hint(lines: list[bytes], start: int) -> str:
    """What the hunk header at `start` should say, counted from the hunk's lines (up to the next hunk or file),
    and the two ways to get there."""
    m = HUNK_HEADER.match(lines[start])
    assert m is not None
    old = new = 0
    body = lines[start + 1:]
    end = next((n for n, line in enumerate(body) if line.startswith((b"@@", b"diff --git ", b"-- \n"))), len(body))
    body = body[:end]
    while body and not body[-1].strip():
        body.pop()  # blank lines after the last hunk of the file belong to no hunk
    for line in body:
        tag = line[:1]
        old += tag in (b" ", b"\n", b"-")
        new += tag in (b" ", b"\n", b"+")
    fixed = f"@@ -{m[1].decode()},{old} +{m[3].decode()},{new} @@"
    return (f"counted from its lines, the header is {fixed} ({old} old, {new} new lines): put that in the file; "
            "or, if the applied tree holds this patch, `vpatch export --force` rewrites the file from its commit")


def _strip_prefix(path: str, prefix: str) -> str:
    return path[len(prefix):] if path.startswith(prefix) else path


def _diff_git_paths(rest: bytes, where: str) -> tuple[str | None, str | None]:
    """The two paths of a "diff --git a/X b/Y" line, quoted or not; (None, None) when names with spaces make
    the split ambiguous (the ---/+++ or rename lines then name the files)."""
    if rest.startswith(b'"'):
        old, end = _unquote(rest, where)
        if rest[end:end + 1] != b" ":
            return None, None
        tail = rest[end + 1:]
        new = _unquote(tail, where)[0] if tail.startswith(b'"') else _decode(tail)
        return _strip_prefix(old, "a/"), _strip_prefix(new, "b/")
    if rest.endswith(b'"') and b' "' in rest:
        cut = rest.rindex(b' "')
        return _strip_prefix(_decode(rest[:cut]), "a/"), _strip_prefix(_unquote(rest[cut + 1:], where)[0], "b/")
    half = (len(rest) - 1) // 2
    if len(rest) % 2 == 1 and rest[half:half + 1] == b" " and rest[2:half] == rest[half + 3:] \
            and rest.startswith(b"a/") and rest[half + 1:].startswith(b"b/"):
        path = _decode(rest[2:half])  # the usual case: the same name on both sides, spaces or not
        return path, path
    if rest.count(b" ") == 1:
        a, b = rest.split(b" ")
        return _strip_prefix(_decode(a), "a/"), _strip_prefix(_decode(b), "b/")
    return None, None


def _header_path(value: bytes, where: str) -> str:
    """A path on a ---/+++/rename line: C-quoted, or plain with git's trailing tab after names with spaces."""
    if value.startswith(b'"'):
        return _unquote(value, where)[0]
    return _decode(value.removesuffix(b"\t"))


def _unquote(text: bytes, where: str) -> tuple[str, int]:
    """Git's C-style quoted path at the start of `text`: the path and the index just past the closing quote."""
    out = bytearray()
    i = 1
    while i < len(text):
        c = text[i]
        if c == ord('"'):
            return _decode(bytes(out)), i + 1
        if c == ord("\\"):
            nxt = text[i + 1:i + 2]
            if nxt and nxt[0] in _C_ESCAPES:
                out.append(_C_ESCAPES[nxt[0]])
                i += 2
                continue
            digits = text[i + 1:i + 4]
            if len(digits) == 3 and all(48 <= d <= 55 for d in digits):
                out.append(int(digits, 8))
                i += 4
                continue
            raise SeriesError(f"{where}: bad escape in the quoted path {text[:80].decode('utf-8', 'replace')!r}",
                              hint="git quotes paths with \\t, \\n, \\\\, \\\" and three-digit octal escapes; "
                                   "regenerate the patch with vpatch export or git format-patch")
        out.append(c)
        i += 1
    raise SeriesError(f"{where}: unterminated quoted path {text[:80].decode('utf-8', 'replace')!r}",
                      hint="regenerate the patch with vpatch export or git format-patch")


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")

