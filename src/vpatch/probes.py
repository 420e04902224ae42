"""Landing probes: the evidence that a tree has a patch's fix, even when upstream wrote it differently.

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

In ``run``, ``{python}`` is the probe venv's python, ``{probe_dir}`` the folder of the YAML file and
``{tree}`` the tree root; the tree root is also first on PYTHONPATH. Exit code 0 = PASS (the fix is
there), 1 = FAIL (the bug is there), anything else or a timeout = ERROR: the probe could not decide,
which is never read as pass or fail.

A missing file is never evidence (docs/moves.md). A `files` check on a path missing from the tree follows
the file where it moved: with `moves_from` (the commit the probe's paths name, the pin) git's rename
detection from there finds its successor, the checks run on that file and the detail says so. A path
with no successor (deleted, or split into near-equal candidates) makes the probe an ERROR, counted
neither way - unless the check says `absent_is_fix: true`, when a file deleted without successor holds.
Python exits 1 on an uncaught exception, so exit 1 with a Python
traceback in the output is an ERROR too; a probe script should still catch its own errors and exit 2.

The probe venv is built once per set of requirements (keyed by their hash) under
``$VPATCH_CACHE/probe-venvs/``, in a temporary folder renamed into place. Results are cached as small
JSON files under ``$VPATCH_CACHE/probe-results/``, keyed by the probe's content (the YAML and every
``{probe_dir}`` file it runs) and the tree id; ERROR is never cached. ``validate_probe`` refuses a
probe that does not FAIL on the pin and PASS on the pin plus its patch: a probe that passes
everywhere would drop a needed patch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vpatch import git, process
from vpatch.errors import ProcessError, VpatchError
from vpatch.fs import atomic_write
from vpatch.probe_env import (
    LOCK_NAME,
    EnvError,
    Requirements,
    probe_venv,
    remove_stale_runs,
)
from vpatch.probe_outcome import PLACEHOLDER, Place, Ran, argv, interpret
from vpatch.probe_outcome import ProbeKind as ProbeKind  # noqa: PLC0414 - re-exported: a probe's model
from vpatch.probe_outcome import ProbeOutcome as ProbeOutcome  # noqa: PLC0414 - re-exported: a probe's model
from vpatch.progress import Event, Reporter, silent
from vpatch.upstream import cache_dir, mirror

if TYPE_CHECKING:
    from vpatch.config import Config
    from vpatch.series import Patch

DEFAULT_TIMEOUT = 900.0
_PLACEHOLDERS = ("python", "probe_dir", "tree")
_KEYS = {"files": {"kind", "files"}, "command": {"kind", "run", "requirements", "lock", "timeout"}}
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
        import yaml  # imported here: status imports this module and rarely needs YAML

        from vpatch import yamlload

        try:
            data = yamlload.load(raw)
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
        if kind is ProbeKind.FILES:
            return cls(path=path, kind=kind, raw=raw, files=_parse_files(path, data.get("files")))
        return cls(
            path=path, kind=kind, raw=raw,
            run=_parse_run(path, data.get("run")),
            requirements=_strings(path, "requirements", data.get("requirements", []), allow_empty=True),
            lock=_parse_lock(path, data),
            timeout=_parse_timeout(path, data.get("timeout", DEFAULT_TIMEOUT)),
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


@dataclass(frozen=True)
class ProbeResult:
    """One probe's answer on one tree."""

    outcome: ProbeOutcome
    tree: str
    detail: str = ""  # what decided it: the failed checks, or the tail of the command's output
    seconds: float = 0.0
    cached: bool = False  # answered from the result cache, nothing ran

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["outcome"] = self.outcome.value
        del data["cached"]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProbeResult:
        return cls(outcome=ProbeOutcome(data["outcome"]), tree=str(data["tree"]), detail=str(data["detail"]),
                   seconds=float(data["seconds"]), cached=True)


def run_probe(repo: Path, probe: Probe, treeish: str, *, cache: Path | None = None,
              use_cache: bool = True, report: Reporter = silent, label: str | None = None,
              moves_from: str | None = None) -> ProbeResult:
    """Run `probe` against `treeish` of `repo` (a commit or tree id), or answer from the result cache.

    `moves_from`: the commit whose paths the probe names (the pin): a `files` check on a path missing from
    the tree follows the file's move from there (see the module docstring)."""
    cache = cache_dir() if cache is None else cache
    tree = git.tree_of(repo, treeish)
    name = f"{tree}.json"
    if probe.kind is ProbeKind.FILES:
        # Never the plain name: results cached before a missing file became an error (when it satisfied
        # not_contains) are stored under it and must not be read. What a missing path means depends on the
        # commit it is followed from, so that is part of the name when a path is missing.
        named = [check.path for check in probe.files]
        missing = any(blob is None for blob in git.read_blobs(repo, tree, named).values())
        name = f"{tree}.files-2" + (f"-from-{moves_from}" if missing and moves_from else "") + ".json"
    entry = cache / "probe-results" / probe.content_hash() / name
    if use_cache:
        cached = _read_result(entry)
        if cached is not None:
            return cached
    started = time.monotonic()
    if probe.kind is ProbeKind.FILES:
        outcome, detail = _run_files(repo, probe, tree, moves_from)
    else:
        outcome, detail = _run_command(repo, probe, tree, cache, report, f"probe {label or probe.name}")
    result = ProbeResult(outcome, tree, detail, round(time.monotonic() - started, 3))
    # An ERROR may be passing trouble (a timeout, a failed venv build): ask again next time.
    if outcome is not ProbeOutcome.ERROR:
        atomic_write(entry, json.dumps(result.to_json(), indent=1).encode() + b"\n")
    return result


def _read_result(entry: Path) -> ProbeResult | None:
    try:
        return ProbeResult.from_json(json.loads(entry.read_bytes()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def tree_place(repo: Path, tree: str, moves_from: str | None, run: Callable[[Probe], Ran] | None = None) -> Place:
    """A tree of `repo` as the place a probe runs: files read from git's objects, moves followed from
    `moves_from` (the pin) by git's rename detection; a command needs `run` (the tree extracted)."""
    from vpatch import moves

    def follow(gone: Sequence[str], blobs: Mapping[str, bytes | None]) -> Mapping[str, moves.Move]:
        if moves_from is None:
            return {}
        return moves.follow(repo, moves_from, tree, moves.missing_paths(repo, moves_from, tree, gone, dict(blobs)),
                            describe=False)

    def no_command(probe: Probe) -> Ran:
        raise AssertionError(f"{probe.name}: a files probe runs no command")

    return Place("tree", lambda paths: git.read_blobs(repo, tree, paths), run or no_command, follow)


def _run_files(repo: Path, probe: Probe, tree: str, moves_from: str | None) -> tuple[ProbeOutcome, str]:
    return interpret(probe, tree_place(repo, tree, moves_from))


def _run_command(repo: Path, probe: Probe, tree: str, cache: Path, report: Reporter,
                 subject: str) -> tuple[ProbeOutcome, str]:
    try:
        python = probe_venv(probe.environment(), cache=cache, report=report)
    except EnvError as exc:
        report(Event(subject, ProbeOutcome.ERROR.value, "the probe venv could not be built", final=True))
        return ProbeOutcome.ERROR, exc.message
    # Timed from here: the venv build (once) is reported on its own.
    started = time.monotonic()
    report(Event(subject, "running"))
    # a partial mirror: the tree's files in one request, where extracting it would fetch them one at a time
    mirror.prefetch_tree(repo, tree, report=report)
    outcome, detail = _run_in_tree(repo, probe, tree, cache, python)
    report(Event(subject, outcome.value, final=True, seconds=time.monotonic() - started))
    return outcome, detail


def _run_in_tree(repo: Path, probe: Probe, tree: str, cache: Path, python: Path) -> tuple[ProbeOutcome, str]:
    runs = cache / "probe-runs"
    runs.mkdir(parents=True, exist_ok=True)
    # A killed run leaves its extracted tree (100+ MB); the folder's pid says when it is stale.
    remove_stale_runs(runs)
    with tempfile.TemporaryDirectory(prefix=f"run-{os.getpid()}-", dir=runs) as tmp:
        root = Path(tmp) / "tree"
        git.extract_tree(repo, tree, root)
        command = argv(probe, python=str(python), probe_dir=str(probe.path.parent.resolve()), tree=str(root))
        env = {
            "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p),
            "PYTHONDONTWRITEBYTECODE": "1",
        }

        def run(probe: Probe) -> Ran:
            try:
                # Its own process group, so that a timeout also ends what the probe started.
                proc = process.run(command, cwd=root, env=env, check=False, merge_output=True, timeout=probe.timeout,
                                   own_group=True)
            except ProcessError as exc:
                if exc.timed_out:
                    return Ran(124, exc.output.encode(), timed_out=True)
                return Ran(-1, b"", failure=exc.message)
            return Ran(proc.returncode, proc.stdout)

        return interpret(probe, tree_place(repo, tree, None, run))


@dataclass(frozen=True)
class Validation:
    """A probe checked on both sides: ok when it FAILs on the base tree and PASSes with the patch."""

    ok: bool
    detail: str  # one sentence: what it did on each side, and why that is (not) enough
    base: ProbeResult
    patched: ProbeResult
    hint: str = ""  # what to do when not ok


def probe_for(patch: Patch) -> Probe | None:
    """The probe a patch names in its Probe: trailer (None when it names none)."""
    path = patch.probe_path
    return None if path is None else Probe.load(path)


def validation(repo: Path, probe: Probe, patch_file: str, *, base: str, patched: str, base_name: str | None = None,
               cache: Path | None = None, report: Reporter = silent, use_cache: bool = True,
               moves_from: str | None = None) -> Validation:
    """The probe on `base` (it must FAIL there) and on `patched` (it must PASS): the one check that `update`,
    `update --dry-run`, `status` and `probe check` all make. Says, never raises, when the probe falls short."""
    name = base_name or base[:12]
    label = name[:12] if git.is_object_id(name) else name  # progress lines name a commit by its short id
    before = run_probe(repo, probe, base, cache=cache, report=report, use_cache=use_cache,
                       label=f"{patch_file.removesuffix('.patch')} on {label}", moves_from=moves_from)
    after = run_probe(repo, probe, patched, cache=cache, report=report, use_cache=use_cache,
                      label=f"{patch_file.removesuffix('.patch')} on {label} with the patch", moves_from=moves_from)
    # a path the pin has is no typo: where it is missing, run_probe followed its move (or called it an error)
    absent = absent_files(repo, probe, (base, patched) + ((moves_from,) if moves_from else ()))
    if absent:
        # A checked file on neither side is a typo or a move: whatever the checks said, they read nothing.
        return Validation(False, f"probe {probe.name}: files: {absent[0]}: no such file on {name} nor with the patch"
                          + (f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""),
                          before, after, hint="fix the path (it is relative to the tree root) or remove the entry")
    if before.outcome is ProbeOutcome.FAIL and after.outcome is ProbeOutcome.PASS:
        return Validation(True, f"{probe.name} fails without the patch and passes with it", before, after)
    return Validation(False, f"probe {probe.name} does not discriminate for {patch_file}: it {says(before)} on {name}"
                      f" without the patch and {says(after)} with it (it must fail, then pass)",
                      before, after, hint=_validation_hint(before, after))


def absent_files(repo: Path, probe: Probe, trees: tuple[str, ...]) -> list[str]:
    """The paths a `files` probe checks that exist in none of `trees`."""
    if probe.kind is not ProbeKind.FILES:
        return []
    paths = [check.path for check in probe.files]
    found = [git.read_blobs(repo, tree, paths) for tree in trees]
    return [path for path in paths if all(blobs.get(path) is None for blobs in found)]


def validate_probe(repo: Path, config: Config | None, patch: Patch, *, base: str, patched: str | None = None,
                   cache: Path | None = None, report: Reporter = silent) -> Validation:
    """Check that the patch's probe FAILs on `base` and PASSes on `patched` (default: `base` + the patch).

    Raises ProbeError when the patch has no probe or the probe does not tell the two apart.
    """
    probe = probe_for(patch)
    pin = moves_base(repo, config)
    if probe is None:
        raise ProbeError(f"{patch.filename} names no probe", hint="add a Probe: trailer naming a file under probes/")
    if patched is None:
        patched = git.tree_with_patch(repo, base, patch.raw)
        if patched is None:
            raise ProbeError(f"{patch.filename} does not apply to {base}, so its probe cannot be validated there",
                             hint=f"vpatch apply --ref {base} to see the conflict")
    checked = validation(repo, probe, patch.filename, base=base, patched=patched, base_name=base, cache=cache,
                         report=report, moves_from=pin)
    if not checked.ok:
        raise ProbeError(checked.detail, hint=checked.hint)
    return checked


def moves_base(repo: Path, config: Config | None) -> str | None:
    """The commit whose paths a project's probes name: its pin (None without a project, or when the pin names
    nothing here); a `files` check follows moves from there."""
    if config is None:
        return None
    return config.pin.commit if config.pin.commit and git.resolve_commit(repo, config.pin.commit) \
        else git.resolve_commit(repo, config.pin.ref)


def says(result: ProbeResult) -> str:
    """"passes" / "fails" / "errors": a result in a sentence."""
    return {ProbeOutcome.PASS: "passes", ProbeOutcome.FAIL: "fails", ProbeOutcome.ERROR: "errors"}[result.outcome]


def _validation_hint(before: ProbeResult, after: ProbeResult) -> str:
    if ProbeOutcome.ERROR in (before.outcome, after.outcome):
        broken = before if before.outcome is ProbeOutcome.ERROR else after
        return "the probe could not decide: " + (broken.detail.splitlines() or ["no output"])[-1]
    if before.outcome is ProbeOutcome.PASS:
        return "a probe that passes without the patch would drop a needed patch: make it test the bug itself"
    return "the probe still fails with the patch: make it test what the patch changes"
