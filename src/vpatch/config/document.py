"""The one reader of vpatch's YAML documents (vpatch.yaml, images/<name>.yaml, question files): every error
names the file and the key path; text keys take scalars as written; a present but empty section is an error."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, NoReturn

from vpatch.base import ConfigError
from vpatch.config import yamlload
from vpatch.config.yamlload import source_text


class Document:
    """Validation helpers over one parsed file. Keys are dotted paths ("serve.container.name"); the helpers
    that read a value from a mapping take the path and look up its last part."""

    def __init__(self, source: str) -> None:
        self.source = source

    @classmethod
    def parse(cls, text: str | bytes, *, source: str) -> tuple[Document, Any]:
        """The document and its data; plain scalars keep their source text (see `text`)."""
        import yaml  # lazy: PyYAML loads only when a file is read; --help reads none


        try:
            return cls(source), yamlload.load(text, keep_text=True)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{source}: not valid YAML: {exc}", hint="fix the YAML syntax") from exc

    @classmethod
    def read(cls, path: Path, *, source: str, what: str, hint: str | None = None) -> tuple[Document, Any]:
        """`parse` of the file at `path`; `what` says what it is in the error when it cannot be read."""
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{source}: cannot read {what}: {exc}", hint=hint or f"{source} must be a readable UTF-8 "
                              "YAML file") from exc
        return cls.parse(text, source=source)

    def fail(self, key: str, message: str, hint: str | None = None) -> NoReturn:
        where = f"key '{key}'" if key else "top level"
        raise ConfigError(f"{self.source}: {where} {message}", hint=hint or f"fix {where} in {self.source}")

    def mapping(
        self, value: Any, key: str, *, required: frozenset[str] | set[str] = frozenset(),
        optional: frozenset[str] | set[str] = frozenset(),
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(key, f"must be a mapping, not {_shown(value)}")
        prefix = f"{key}." if key else ""
        for name in value:
            if name not in required | optional:
                known = ", ".join(sorted(required | optional))
                self.fail(f"{prefix}{name}", f"is not a known key (known here: {known})")
        for name in sorted(required):
            if name not in value:
                self.fail(f"{prefix}{name}", "is missing")
        return value

    def section(
        self, data: dict[str, Any], key: str, *, required: frozenset[str] | set[str] = frozenset(),
        optional: frozenset[str] | set[str] = frozenset(), empty_ok: bool = False,
    ) -> dict[str, Any] | None:
        """The mapping under `key`, None when the key is absent. Present but empty (null, false, [], 0, and {}
        unless `empty_ok`) is an error: a section left empty by mistake must not silently mean the defaults."""
        name = key.rsplit(".", 1)[-1]
        if name not in data:
            return None
        return self.filled(data[name], key, required=required, optional=optional, empty_ok=empty_ok)

    def filled(
        self, value: Any, key: str, *, required: frozenset[str] | set[str] = frozenset(),
        optional: frozenset[str] | set[str] = frozenset(), empty_ok: bool = False,
    ) -> dict[str, Any]:
        """`value` as the mapping of section `key`: see `section`."""
        if not isinstance(value, dict) or (not value and not empty_ok):
            self.fail(key, f"is {_shown(value)}: give it its keys, or leave the key out" + (
                "" if empty_ok else " for the defaults"))
        return self.mapping(value, key, required=required, optional=optional)

    def shown(self, value: Any) -> str:
        """How a message names a value: its kind for a mapping or a list (never the loader's class name), else
        the value."""
        return _shown(value)

    def string(self, data: dict[str, Any], key: str, default: str | None = None) -> str:
        name = key.rsplit(".", 1)[-1]
        value = data.get(name, default)
        if value is None:
            self.fail(key, "is missing" if name not in data else "is empty (null)")
        if isinstance(value, (bool, int, float)):
            raw = _raw(data, name, value)
            self.fail(key, f"must be a string, not {value!r}: YAML reads the unquoted {raw} as "
                      f"{type(value).__name__} {value!r}", hint=f"quote it: {name}: \"{raw}\"")
        if not isinstance(value, str) or not value.strip():
            self.fail(key, f"must be a non-empty string, not {_shown(value)}")
        return value

    def optional_string(self, data: dict[str, Any], key: str) -> str | None:
        if data.get(key.rsplit(".", 1)[-1]) is None:
            return None
        return self.string(data, key)

    def text(self, container: Any, index: Any, key: str) -> str:
        """A scalar taken as written: `0123`, `2.10`, `1:30`, `on` and `010` stay those strings (YAML 1.1 would
        make them 83, 2.1, 90, True and 8). For environment values and command-line words."""
        value = container[index]
        if isinstance(value, str):
            return value
        if value is None:
            self.fail(key, "is empty (null)", hint=f"write \"\" for an empty value, or remove {key}")
        if isinstance(value, (bool, int, float)):
            return _raw(container, index, value)
        self.fail(key, f"must be a string, not {_shown(value)}")

    def texts(self, value: Any, key: str) -> tuple[str, ...]:
        """A list of scalars, each taken as written (see `text`)."""
        if not isinstance(value, list):
            self.fail(key, f"must be a list of strings, not {_shown(value)}")
        return tuple(self.text(value, i, f"{key}[{i}]") for i in range(len(value)))

    def number(self, data: dict[str, Any], key: str, default: float | None = None) -> float:
        """A finite number above zero (.nan and .inf are refused: every check compares with it)."""
        name = key.rsplit(".", 1)[-1]
        value = data.get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            self.fail(key, f"must be a finite positive number, not {_written(data, name, value)}")
        self._as_written(data, name, key, value, _DECIMAL)
        return float(value)

    def count(self, data: dict[str, Any], key: str, default: int | None = None, *, zero: bool = False) -> int:
        name = key.rsplit(".", 1)[-1]
        value = data.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
            what = "non-negative" if zero else "positive"
            self.fail(key, f"must be a {what} whole number, not {_written(data, name, value)}")
        self._as_written(data, name, key, value, _WHOLE)
        return value

    def _as_written(self, data: Any, name: str, key: str, value: Any, form: re.Pattern[str]) -> None:
        """A number must be written as a plain decimal: YAML 1.1 reads `010` as 8 (octal), `0x10` as 16,
        `1_000` as 1000 and `1:30` as 90, where YAML 1.2 and every reader of the file see something else."""

        raw = source_text(data, name)
        if raw is not None and not form.match(raw):
            self.fail(key, f"is written {raw}, which YAML 1.1 reads as {value!r} (a leading zero is octal, 0x hex, "
                      "_ and : group digits) and YAML 1.2 otherwise", hint=f"write the number plainly: {name}: {value}")

    def flag(self, data: dict[str, Any], key: str) -> bool:
        value = data.get(key.rsplit(".", 1)[-1])
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, not {_shown(value)}")
        return value


_WHOLE = re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$")
_DECIMAL = re.compile(r"^[-+]?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$")


def _written(container: Any, index: Any, value: Any) -> str:
    """A refused value as the file has it: a quoted "18610" keeps its quotes (it is text), a plain 018610
    says that YAML read it as text."""

    raw = source_text(container, index)
    if raw is None:
        return _shown(value)  # quoted: repr() shows the quotes that make it a string
    if isinstance(value, str):
        return f"{raw} (YAML reads it as text{': a leading zero' if raw[:1] == '0' else ''})"
    return _shown(value, raw)


def _raw(container: Any, index: Any, value: Any) -> str:

    raw = source_text(container, index)
    return raw if raw is not None else str(value)


def _shown(value: Any, raw: str | None = None) -> str:
    if value is None:
        return "empty (null)"
    if isinstance(value, (dict, list)) and not value:
        return f"an empty {'mapping' if isinstance(value, dict) else 'list'}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool) and raw is None:
        return "true" if value else "false"  # as YAML writes it, not Python's True/False
    return raw if raw is not None and raw != repr(value) else repr(value)
