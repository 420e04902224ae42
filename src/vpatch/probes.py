"""Running probes on a tree (probe_file.py is the file, probe_outcome.py what its answer means).

The tree root is first on PYTHONPATH of a command probe. Exit code 0 = PASS (the fix is there), 1 = FAIL
(the bug is there), anything else or a timeout = ERROR: the probe could not decide, which is never read as
pass or fail.

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

import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vpatch import git, process
from vpatch.errors import ProcessError
from vpatch.fs import atomic_write
from vpatch.probe_env import EnvError, probe_venv, remove_stale_runs
from vpatch.probe_file import Probe, ProbeError, probe_for
from vpatch.probe_outcome import Place, Ran, argv, interpret
from vpatch.probe_outcome import ProbeKind as ProbeKind  # noqa: PLC0414 - re-exported: a probe's model
from vpatch.probe_outcome import ProbeOutcome as ProbeOutcome  # noqa: PLC0414 - re-exported: a probe's model
from vpatch.progress import Event, Reporter, silent
from vpatch.upstream import cache_dir, mirror

if TYPE_CHECKING:
    from vpatch.config import Config
    from vpatch.series import Patch


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
    # a target is named one way everywhere: its ref name where it has one, else its short id
    name = (config.pin.ref if config is not None and base == pin else None) or git.tag_at(repo, base) or base[:12]
    if probe is None:
        raise ProbeError(f"{patch.filename} names no probe", hint="add a Probe: trailer naming a file under probes/")
    if patched is None:
        patched = git.tree_with_patch(repo, base, patch.raw)
        if patched is None:
            raise ProbeError(f"{patch.filename} does not apply to {name}, so its probe cannot be validated there",
                             hint=f"vpatch apply --ref {name} to see the conflict")
    checked = validation(repo, probe, patch.filename, base=base, patched=patched, base_name=name, cache=cache,
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
