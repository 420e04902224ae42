"""A probe file: the evidence that a tree has a patch's fix, even when upstream wrote it differently.

A probe is a YAML file next to the series (a patch names it in its ``Probe:`` trailer, relative to
the patches folder). Two kinds::

    # declarative: every listed file must contain / must not contain each literal string
    kind: files
    files:
      vllm/path/x.py:
        contains: ["..."]
        not_contains: ["..."]
      vllm/path/old_helper.py:
        absent_is_fix: true      # the fix is that this file is gone (say so, or a missing file is an error)
    ---
    # behavioural: a command run against the materialised tree, cwd = the tree root
    kind: command
    run: ["{python}", "{probe_dir}/0002-mamba-null-gap-free.py"]
    requirements: ["torch==2.13.0", "..."]   # pip requirements of the probe venv (default: none)
    timeout: 900                              # seconds (default 900)
    fresh_process: true                       # never in the warm interpreter (default false)

In ``run``, ``{python}`` is the probe venv's python, ``{probe_dir}`` the folder of the YAML file and
``{tree}`` the tree root. The file is typed and validated here, every error naming the file and the key;
what its answer means is probe_outcome.py's, running it on a tree probes.py's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch.base import VpatchError
from vpatch.config import load_yaml
from vpatch.probes.env import LOCK_NAME, Requirements
from vpatch.probes.outcome import PLACEHOLDER, ProbeKind
from vpatch.series import missing_probe

if TYPE_CHECKING:
    from vpatch.series import Patch

DEFAULT_TIMEOUT = 900.0
_PLACEHOLDERS = ("python", "probe_dir", "tree")
_KEYS = {"files": {"kind", "files", "upstream_tests", "upstream_test"},
         "command": {"kind", "run", "requirements", "lock", "timeout", "fresh_process", "upstream_tests",
                     "upstream_test"}}
_FILE_KEYS = {"contains", "not_contains", "absent_is_fix"}


class ProbeError(VpatchError):
    """A probe file is invalid, or a probe does not tell the patched tree from the unpatched one."""


@dataclass(frozen=True)
class FileCheck:
    path: str
    contains: tuple[str, ...] = ()
    not_contains: tuple[str, ...] = ()
    absent_is_fix: bool = False  # the file being gone (deleted, no successor) is the fix itself


@dataclass(frozen=True)
class Probe:
    path: Path
    kind: ProbeKind
    raw: bytes
    files: tuple[FileCheck, ...] = ()
    run: tuple[str, ...] = ()
    requirements: tuple[str, ...] = ()
    lock: Path | None = None  # a lock file of exact pins (next to the probe) instead of `requirements`
    timeout: float = DEFAULT_TIMEOUT
    fresh_process: bool = False  # never in a warm interpreter (probes/zygote.py): a fresh `python` every run
    # upstream's tests run as regression evidence (probes/regression.py): test files or node ids of the tree;
    # None: found from the files the patch touches; (): none, on purpose
    upstream_tests: tuple[str, ...] | None = None
    # the patch's own test in upstream's layout (`vpatch forward`, docs/forwarding.md): where it goes in upstream's
    # tree (tests/...), and its file beside the probe (the same file name)
    upstream_test: tuple[str, Path] | None = None

    @property
    def name(self) -> str:
        return self.path.name

    @classmethod
    def load(cls, path: Path) -> Probe:
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ProbeError(f"{path}: cannot read the probe: {exc}",
                             hint="a patch's Probe: trailer is relative to the patches folder") from exc
        return cls.read(raw, path=path)

    @classmethod
    def read(cls, raw: bytes, *, path: Path) -> Probe:
        """The probe that `raw` says, as if read from `path` (an update checks a probe it rewrote before writing it)."""
        import yaml  # lazy: status imports this module and rarely needs YAML


        try:
            data = load_yaml(raw)
        except yaml.YAMLError as exc:
            raise ProbeError(f"{path}: not valid YAML: {exc}") from exc
        return cls.parse(data, path=path, raw=raw)

    @classmethod
    def parse(cls, data: object, *, path: Path, raw: bytes) -> Probe:
        if not isinstance(data, dict):
            raise ProbeError(f"{path}: a probe is a mapping with a 'kind' key", hint=_KIND_HINT)
        kind_value = data.get("kind")
        if kind_value not in _KEYS:
            raise ProbeError(f"{path}: kind: must be 'files' or 'command', not {kind_value!r}", hint=_KIND_HINT)
        kind = ProbeKind(kind_value)
        unknown = sorted(str(k) for k in data if k not in _KEYS[kind.value])
        if unknown:
            raise ProbeError(f"{path}: {unknown[0]}: not a key of a '{kind.value}' probe",
                             hint=f"a '{kind.value}' probe has the keys: {', '.join(sorted(_KEYS[kind.value]))}")
        tests = _parse_tests(path, data["upstream_tests"]) if "upstream_tests" in data else None
        own = _parse_own_test(path, data["upstream_test"]) if "upstream_test" in data else None
        if kind is ProbeKind.FILES:
            return cls(path=path, kind=kind, raw=raw, files=_parse_files(path, data.get("files")),
                       upstream_tests=tests, upstream_test=own)
        return cls(
            path=path, kind=kind, raw=raw, upstream_tests=tests, upstream_test=own,
            run=_parse_run(path, data.get("run")),
            requirements=_strings(path, "requirements", data.get("requirements", []), allow_empty=True),
            lock=_parse_lock(path, data),
            timeout=_parse_timeout(path, data.get("timeout", DEFAULT_TIMEOUT)),
            fresh_process=_parse_flag(path, "fresh_process", data.get("fresh_process", False)),
        )

    def environment(self) -> Requirements:
        """What the probe venv holds: the lock file's pins, or the plain requirement list."""
        if self.lock is not None:
            return Requirements.from_lock(self.lock)
        return Requirements.inline(self.requirements)

    def referenced_files(self) -> tuple[Path, ...]:
        """The files next to the probe that its command runs, and its lock file (part of its content hash)."""
        found: dict[Path, None] = {self.lock: None} if self.lock is not None else {}
        for arg in self.run:
            for match in re.finditer(r"\{probe_dir\}/([^\s{}]+)", arg):
                found[self.path.parent / match.group(1)] = None
        return tuple(found)

    def content_hash(self) -> str:
        """Changes whenever the probe or a script it runs changes: the result cache's first key."""
        digest = hashlib.sha256(b"vpatch-probe-1\0" + self.raw)
        for ref in self.referenced_files():
            digest.update(b"\0" + ref.name.encode() + b"\0")
            try:
                digest.update(ref.read_bytes())
            except OSError as exc:
                raise ProbeError(f"{self.path}: run: cannot read {ref.name}: {exc}",
                                 hint="scripts a probe runs live next to it, named as {probe_dir}/NAME") from exc
        return digest.hexdigest()


_KIND_HINT = "kind: files (must contain / must not contain, per file) or kind: command (run: [...], exit code)"


def _strings(path: Path, key: str, value: object, *, allow_empty: bool = False) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ProbeError(f"{path}: {key}: must be a list of non-empty strings")
    if not value and not allow_empty:
        raise ProbeError(f"{path}: {key}: must not be empty")
    return tuple(value)


def _parse_files(path: Path, value: object) -> tuple[FileCheck, ...]:
    if not isinstance(value, dict) or not value:
        raise ProbeError(f"{path}: files: must map tree paths to their checks",
                         hint="files:\n  vllm/x.py:\n    contains: [\"...\"]\n    not_contains: [\"...\"]")
    checks = []
    for name, spec in value.items():
        where = f"files: {name}"
        if not isinstance(name, str) or not name or name.startswith("/"):
            raise ProbeError(f"{path}: {where}: must be a path relative to the tree root")
        if not isinstance(spec, dict) or not spec:
            raise ProbeError(f"{path}: {where}: must have contains and/or not_contains")
        unknown = sorted(str(k) for k in spec if k not in _FILE_KEYS)
        if unknown:
            raise ProbeError(f"{path}: {where}: {unknown[0]}: not a file check",
                             hint="a file has the checks: contains, not_contains, absent_is_fix")
        absent = spec.get("absent_is_fix", False)
        if not isinstance(absent, bool):
            raise ProbeError(f"{path}: {where}: absent_is_fix: must be true or false, not {absent!r}",
                             hint="absent_is_fix: true says the file being gone is the fix; leave it out otherwise")
        check = FileCheck(
            path=name,
            contains=_strings(path, f"{where}: contains", spec.get("contains", []), allow_empty=True),
            not_contains=_strings(path, f"{where}: not_contains", spec.get("not_contains", []), allow_empty=True),
            absent_is_fix=absent,
        )
        if not (check.contains or check.not_contains or check.absent_is_fix):
            raise ProbeError(f"{path}: {where}: checks nothing",
                             hint="give contains and/or not_contains strings, or absent_is_fix: true")
        checks.append(check)
    return tuple(checks)


def _parse_tests(path: Path, value: object) -> tuple[str, ...]:
    tests = _strings(path, "upstream_tests", value, allow_empty=True)
    for test in tests:
        file = test.split("::", 1)[0]
        if not file.startswith("tests/") or not file.endswith(".py") or ".." in file.split("/"):
            raise ProbeError(f"{path}: upstream_tests: {test!r} is not a test file of the tree",
                             hint="name upstream's test files (or node ids) under tests/, e.g. "
                                  "tests/parser/engine/test_qwen3.py; [] runs none")
    return tests


def _parse_own_test(path: Path, value: object) -> tuple[str, Path]:
    """upstream_test: tests/<area>/test_<name>.py, its file test_<name>.py beside the probe."""
    text = value if isinstance(value, str) else ""
    parts = text.split("/")
    if not text or parts[0] != "tests" or len(parts) < 2 or ".." in parts or not parts[-1].startswith("test_") \
            or not parts[-1].endswith(".py"):
        raise ProbeError(f"{path}: upstream_test: {value!r} is not a test file path in upstream's tests/",
                         hint="name where the test goes in upstream's tree, e.g. tests/parser/test_qwen3_names.py, "
                              "and put the file (test_qwen3_names.py) beside the probe")
    source = path.parent / parts[-1]
    if not source.is_file():
        raise ProbeError(f"{path}: upstream_test: {value}: no file {parts[-1]} beside the probe",
                         hint=f"write the test as {source.name} in {path.parent.name}/ (it is copied to {value})")
    return text, source


def _parse_run(path: Path, value: object) -> tuple[str, ...]:
    run = _strings(path, "run", value)
    for arg in run:
        if "\0" in arg:  # no process argument can hold one; refused here, not as an internal error at run time
            raise ProbeError(f"{path}: run: an argument contains a NUL byte: {arg!r}",
                             hint="remove the \\0 from the command")
        for match in PLACEHOLDER.finditer(arg):
            if match.group(1) not in _PLACEHOLDERS:
                raise ProbeError(f"{path}: run: unknown placeholder {match.group(0)}",
                                 hint="placeholders: {python}, {probe_dir}, {tree}")
    return run


def _parse_lock(path: Path, data: Mapping[str, object]) -> Path | None:
    value = data.get("lock")
    if value is None:
        return None
    if not isinstance(value, str) or not value or "/" in value or value.startswith("."):
        raise ProbeError(f"{path}: lock: must name a lock file next to the probe, e.g. {LOCK_NAME}")
    if data.get("requirements"):
        raise ProbeError(f"{path}: requirements and lock: give one of them",
                         hint="the lock file pins everything the venv holds")
    return path.parent / value


def _parse_timeout(path: Path, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ProbeError(f"{path}: timeout: must be a positive number of seconds")
    return float(value)


def _parse_flag(path: Path, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ProbeError(f"{path}: {key}: must be true or false, not {value!r}")
    return value


def probe_for(patch: Patch) -> Probe | None:
    """The probe a patch names in its Probe: trailer (None when it names none)."""
    path = patch.probe_path
    if path is not None and not path.exists():
        line, wrong, todo = missing_probe(patch, str(patch.trailer("Probe")))
        raise ProbeError(f"{patch.filename}: {line}: {wrong}", hint=todo)
    return None if path is None else Probe.load(path)
