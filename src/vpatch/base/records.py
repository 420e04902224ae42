"""Journals on disk: the small typed records that let interrupted work be finished or undone.

Each record is a frozen dataclass that turns itself into a JSON object and back (`to_dict` / a parser).
It is written atomically, so a kill leaves the old record or the new one, never a mix; reading it back
either gives the record or a JournalError naming the file and what to do about it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from vpatch.base.errors import JournalError
from vpatch.base.fs import atomic_write

R = TypeVar("R")


class Record(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


def save(path: Path, record: Record) -> None:
    """Write `record` to `path` (fsynced: a journal is only worth its name once it is on the disk)."""
    try:
        atomic_write(path, (json.dumps(record.to_dict(), indent=2) + "\n").encode())
    except OSError as exc:
        # Read-only, full, a file where the folder should be: the old record (if any) stays as it was.
        raise JournalError(f"cannot write {path}: {exc.strerror or exc}",
                           hint=f"{path.parent} must be a writable folder with free space; $VPATCH_STATE moves "
                           "vpatch's state folder elsewhere") from None


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once: with two, json would keep the last one without a word."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} is given twice")
        out[key] = value
    return out


def json_kind(value: Any) -> str:
    """What a JSON document holds, in JSON's words (never Python's class name: 'NoneType', 'list')."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    kinds = ((dict, "an object"), (list, "an array"), (str, "a string"), ((int, float), "a number"))
    return next((kind for cls, kind in kinds if isinstance(value, cls)), type(value).__name__)


def json_shown(value: Any) -> str:
    """A value of a JSON document as JSON writes it (null, true, "8000"), never as Python does (None, True, '8000')."""
    try:
        shown = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def load(path: Path, parse: Callable[[dict[str, Any]], R], *, what: str, hint: str) -> R | None:
    """The record in `path`, or None when there is none.

    A file that cannot be read, is not a JSON object, or that `parse` refuses (ValueError, TypeError,
    KeyError: a missing or wrong field) raises JournalError("<what> <path> is unreadable: why", hint)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8
        raise JournalError(f"{what} {path} is unreadable: {exc}", hint=hint) from None
    try:
        data = json.loads(text, object_pairs_hook=_unique)
        if not isinstance(data, dict):
            raise TypeError(f"it must be a JSON object, not {json_kind(data)}")
        return parse(data)
    except (ValueError, TypeError, KeyError) as exc:
        why = f"no field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise JournalError(f"{what} {path} is unreadable: {why}", hint=hint) from None
