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
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vpatch import git, upstream
from vpatch.base import (
    PROCESS_TAIL_CHARS,
    Event,
    ProcessError,
    Reporter,
    VpatchError,
    atomic_write,
    cache_dir,
    run_process,
    silent,
)
from vpatch.probes import workspace as probe_runs
from vpatch.probes.child import SUPERVISOR
from vpatch.probes.env import EnvError, probe_venv
from vpatch.probes.file import Probe, ProbeError, probe_for
from vpatch.probes.outcome import Place, Ran, argv, interpret
from vpatch.probes.outcome import ProbeKind as ProbeKind  # noqa: PLC0414 - re-exported: a probe's model
from vpatch.probes.outcome import ProbeOutcome as ProbeOutcome  # noqa: PLC0414 - re-exported: a probe's model
from vpatch.upstream import Move, follow_file_moves, missing_paths, prefetch_tree

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


@dataclass(frozen=True)
class ProbeRequest:
    """One probe to run on one tree, as `run_ahead` takes it (the arguments of `run_probe`)."""

    probe: Probe
    treeish: str
    label: str | None = None
    moves_from: str | None = None


def run_probe(repo: Path, probe: Probe, treeish: str, *, cache: Path | None = None,
              use_cache: bool = True, report: Reporter = silent, label: str | None = None,
              moves_from: str | None = None, session: probe_runs.Session | None = None) -> ProbeResult:
    """Run `probe` against `treeish` of `repo` (a commit or tree id), or answer from the result cache.

    `moves_from`: the commit whose paths the probe names (the pin): a `files` check on a path missing from
    the tree follows the file's move from there (see the module docstring). `session`: where trees are
    extracted once for the whole command, and where `run_ahead` left its results (None: this run alone,
    in a tree of its own)."""
    cache = (session.cache if session is not None else cache_dir()) if cache is None else cache
    tree, entry = _entry(repo, probe, treeish, cache, moves_from)
    if session is not None and entry in session.ahead:
        # run ahead in parallel: read once, and cached now, as if it had run now
        return _store(entry, session.ahead.pop(entry))
    if use_cache:
        cached = _read_result(entry)
        if cached is not None:
            return cached
    if probe.kind is ProbeKind.FILES:
        started = time.monotonic()
        outcome, detail = _run_files(repo, probe, tree, moves_from)
        return _store(entry, ProbeResult(outcome, tree, detail, round(time.monotonic() - started, 3)))
    subject = f"probe {label or probe.name}"
    python = _venv(probe, cache, report, subject)
    # a partial mirror: the tree's files in one request, where extracting it would fetch them one at a time
    prefetch_tree(repo, tree, report=report)
    if session is not None:
        return _store(entry, _command_result(_run_command(repo, probe, tree, python, session, session.cancel,
                                                          report, subject)))
    # one run alone: a zygote would import for this run only, and pay nothing back
    with probe_runs.Session(cache=cache, jobs=1, zygote=False) as alone:
        return _store(entry, _command_result(_run_command(repo, probe, tree, python, alone, alone.cancel, report,
                                                          subject)))


def _command_result(result: ProbeResult | None) -> ProbeResult:
    if result is None:  # only the end of the command (its session) cancels a run it waits for
        raise VpatchError("the probe run was cancelled", hint="run the command again")
    return result


def run_ahead(repo: Path, requests: Sequence[ProbeRequest], session: probe_runs.Session, *, use_cache: bool = True,
              report: Reporter = silent, first_decides: bool = False) -> list[ProbeResult | None]:
    """Run the command probes of `requests` that the result cache cannot answer, `session.jobs` at a time, and
    keep their results in the session for `run_probe` to read (once each) in whatever order it asks.

    Their outcomes, in the requests' order (None: a files probe, which is cheap and runs when asked, or with
    `first_decides` a run stopped because the first request's run errored). A result is written to the result
    cache when it is read, so a command caches exactly the runs it reads, however many ran at once."""
    found: list[ProbeResult | None] = []
    todo: dict[Path, tuple[Probe, str, str, Path]] = {}
    for request in requests:
        if request.probe.kind is ProbeKind.FILES:
            found.append(None)
            continue
        tree, entry = _entry(repo, request.probe, request.treeish, session.cache, request.moves_from)
        result = session.ahead.get(entry) or (_read_result(entry) if use_cache else None)
        found.append(result)
        if result is None and entry not in todo:
            subject = f"probe {request.label or request.probe.name}"
            python = _venv(request.probe, session.cache, report, subject)
            if not request.probe.fresh_process:
                session.warm_up(python, report)  # before the runs ask for it (Session.zygote_for)
            todo[entry] = (request.probe, tree, subject, python)
    # The git side stays on this thread (a partial mirror fetches what the trees hold); the runs go in parallel.
    for _, tree, _, _ in todo.values():
        prefetch_tree(repo, tree, report=report)
    first = _entry(repo, requests[0].probe, requests[0].treeish, session.cache, requests[0].moves_from)[1] \
        if first_decides and requests and requests[0].probe.kind is ProbeKind.COMMAND else None
    items = list(todo.items())
    done = session.map(lambda item, cancel: _run_command(repo, item[1][0], item[1][1], item[1][3], session, cancel,
                                                         report, item[1][2]), items,
                       stop=lambda i, r: items[i][0] == first and r is not None and r.outcome is ProbeOutcome.ERROR)
    session.ahead.update((entry, result) for entry, result in zip(todo, done) if result is not None)
    return [result or session.ahead.get(_entry(repo, r.probe, r.treeish, session.cache, r.moves_from)[1])
            if r.probe.kind is ProbeKind.COMMAND else None for result, r in zip(found, requests)]


def _entry(repo: Path, probe: Probe, treeish: str, cache: Path, moves_from: str | None) -> tuple[str, Path]:
    """The tree id of `treeish`, and the result-cache file of `probe` on it."""
    tree = git.tree_of(repo, treeish)
    name = f"{tree}.json"
    if probe.kind is ProbeKind.FILES:
        # Never the plain name: results cached before a missing file became an error (when it satisfied
        # not_contains) are stored under it and must not be read. What a missing path means depends on the
        # commit it is followed from, so that is part of the name when a path is missing.
        named = [check.path for check in probe.files]
        missing = any(blob is None for blob in git.read_blobs(repo, tree, named).values())
        name = f"{tree}.files-2" + (f"-from-{moves_from}" if missing and moves_from else "") + ".json"
    return tree, cache / "probe-results" / probe.content_hash() / name


def _store(entry: Path, result: ProbeResult) -> ProbeResult:
    # An ERROR may be passing trouble (a timeout, a failed venv build): ask again next time.
    if result.outcome is not ProbeOutcome.ERROR:
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

    def follow(gone: Sequence[str], blobs: Mapping[str, bytes | None]) -> Mapping[str, Move]:
        if moves_from is None:
            return {}
        return follow_file_moves(repo, moves_from, tree, missing_paths(repo, moves_from, tree, gone, dict(blobs)),
                            describe=False)

    def no_command(probe: Probe) -> Ran:
        raise AssertionError(f"{probe.name}: a files probe runs no command")

    return Place("tree", lambda paths: git.read_blobs(repo, tree, paths), run or no_command, follow)


def _run_files(repo: Path, probe: Probe, tree: str, moves_from: str | None) -> tuple[ProbeOutcome, str]:
    return interpret(probe, tree_place(repo, tree, moves_from))


def _venv(probe: Probe, cache: Path, report: Reporter, subject: str) -> Path:
    """The probe venv's python (built once, and reported on its own). One that cannot be built is an error of
    the environment, raised: never a probe's ERROR, which would read as an invalid probe."""
    try:
        return probe_venv(probe.environment(), cache=cache, report=report)
    except EnvError:
        report(Event(subject, "not run", "the probe venv could not be built", final=True))
        raise


def _run_command(repo: Path, probe: Probe, tree: str, python: Path, session: probe_runs.Session,
                 cancel: threading.Event, report: Reporter, subject: str) -> ProbeResult | None:
    """The probe's command on the tree extracted in `session` (None: `cancel` was set before it ended)."""
    if cancel.is_set():
        return None
    running = probe_runs.Running(report, subject)
    root = running.tree(session, repo, tree)  # the caller has prefetched its files (a partial mirror), on its own thread
    command = argv(probe, python=str(python), probe_dir=str(probe.path.parent.resolve()), tree=str(root))
    # the session's one environment for runs in the venv (offline, HOME its own), the tree first on the path
    env = session.run_env({"PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", ""))
                                                         if p)})

    def run(probe: Probe) -> Ran:
        # one of the session's --jobs processes, before upstream's tests that wait; timed from there
        with running.place(session, first=True):
            return run_once(probe)

    def run_once(probe: Probe) -> Ran:
        zygote = None if probe.fresh_process else session.zygote_for(python, report)
        if zygote is not None and zygote.fits(command, env):
            ran = zygote.run(command, cwd=root, env=env, timeout=probe.timeout, cancel=cancel)
            if ran is not None:  # None: the zygote could not run it to the end, and this run goes fresh
                if ran.cancelled:
                    return Ran(-1, b"", failure="the run was cancelled")
                if ran.timed_out:  # what a fresh run's timeout keeps of the output: its tail (process.run)
                    kept = ran.output.decode("utf-8", "replace")[-PROCESS_TAIL_CHARS:].strip()
                    return Ran(124, kept.encode(), timed_out=True)
                return Ran(ran.returncode, ran.output)
        try:
            # Its own process group, so that a timeout also ends what the probe started; under a supervisor
            # that ends everything the probe started when the probe ends or vpatch dies, even by SIGKILL
            # (child/supervisor.py). -E -s -S: no PYTHONPATH (the tree), no site; its own folder is sys.path[0].
            proc = run_process([sys.executable, "-E", "-s", "-S", str(SUPERVISOR), str(os.getpid()), *command],
                               cwd=root, env=env, check=False, merge_output=True, timeout=probe.timeout,
                               own_group=True, cancel=cancel, shown=command)
        except ProcessError as exc:
            if exc.timed_out:
                return Ran(124, exc.output.encode(), timed_out=True)
            return Ran(-1, b"", failure=exc.message)
        return Ran(proc.returncode, proc.stdout)

    outcome, detail = interpret(probe, tree_place(repo, tree, None, run))
    seconds = running.seconds
    if not cancel.is_set() and not session.intact(tree):
        # the tree went while the probe ran (another process removed the workspace): whatever it said, it did
        # not say it about this tree
        raise VpatchError(f"{subject}: the tree {tree[:12]} it ran on was removed while it ran, so its result is "
                          "no evidence", hint="another process removed vpatch's probe workspace "
                          "($VPATCH_CACHE/probe-runs); run the command again")
    if cancel.is_set() and outcome is ProbeOutcome.ERROR:
        report(Event(subject, "cancelled", final=True, seconds=seconds))
        return None
    report(Event(subject, outcome.value, final=True, seconds=seconds))
    return ProbeResult(outcome, tree, detail, round(seconds, 3))


@dataclass(frozen=True)
class Validation:
    """A probe checked on both sides: ok when it FAILs on the base tree and PASSes with the patch."""

    ok: bool
    detail: str  # one sentence: what it did on each side, and why that is (not) enough
    base: ProbeResult | None  # None: not run (or stopped), because the other side had errored
    patched: ProbeResult | None
    hint: str = ""  # what to do when not ok


def validation(repo: Path, probe: Probe, patch_file: str, *, base: str, patched: str, base_name: str | None = None,
               cache: Path | None = None, report: Reporter = silent, use_cache: bool = True,
               moves_from: str | None = None, session: probe_runs.Session | None = None) -> Validation:
    """The probe on `base` (it must FAIL there) and on `patched` (it must PASS): the one check that `update`,
    `update --dry-run`, `status` and `probe check` all make. Says, never raises, when the probe falls short.

    The two sides run at once where `session` allows two jobs; the first side that errors stops the other (one
    error already makes the probe invalid), and the Validation says which did not run."""
    if session is None:
        with probe_runs.Session(cache=cache) as own:
            return validation(repo, probe, patch_file, base=base, patched=patched, base_name=base_name, cache=cache,
                              report=report, use_cache=use_cache, moves_from=moves_from, session=own)
    name = base_name or base[:12]
    label = name[:12] if git.is_object_id(name) else name  # progress lines name a commit by its short id
    sides = [ProbeRequest(probe, base, f"{patch_file.removesuffix('.patch')} on {label}", moves_from),
             ProbeRequest(probe, patched, f"{patch_file.removesuffix('.patch')} on {label} with the patch", moves_from)]

    def side(request: ProbeRequest) -> ProbeResult:
        return run_probe(repo, probe, request.treeish, cache=cache, report=report, use_cache=use_cache,
                         label=request.label, moves_from=moves_from, session=session)

    # a path the pin has is no typo: where it is missing, run_probe followed its move (or called it an error)
    absent = absent_files(repo, probe, (base, patched) + ((moves_from,) if moves_from else ()))
    if absent:
        # A checked file on neither side is a typo or a move: whatever the checks said, they read nothing.
        return Validation(False, f"probe {probe.name}: files: {absent[0]}: no such file on {name} nor with the patch"
                          + (f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""),
                          side(sides[0]), side(sides[1]),
                          hint="fix the path (it is relative to the tree root) or remove the entry")
    run_ahead(repo, sides, session, use_cache=use_cache, report=report, first_decides=True)

    before = side(sides[0])
    if before.outcome is ProbeOutcome.ERROR:
        # what ran ahead with the patch is not read (nor cached): the same answer as when the sides run in turn
        session.ahead.pop(_entry(repo, probe, patched, session.cache, moves_from)[1], None)
        return Validation(False, f"probe {probe.name} errors on {name} without the patch; stopped there (one error "
                          "already makes the probe invalid): not run with the patch", before, None,
                          hint=_validation_hint(before, None))
    after = side(sides[1])
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
                   cache: Path | None = None, report: Reporter = silent,
                   session: probe_runs.Session | None = None) -> Validation:
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
                         report=report, moves_from=pin, session=session)
    if not checked.ok:
        raise ProbeError(checked.detail, hint=checked.hint)
    return checked


def moves_base(repo: Path, config: Config | None) -> str | None:
    """The commit whose paths a project's probes name: its pin, checked as everywhere (None without a
    project); a `files` check follows moves from there."""
    if config is None:
        return None
    return upstream.pin_commit(repo, config, moved_ok=True)


def says(result: ProbeResult) -> str:
    """"passes" / "fails" / "errors": a result in a sentence."""
    return {ProbeOutcome.PASS: "passes", ProbeOutcome.FAIL: "fails", ProbeOutcome.ERROR: "errors"}[result.outcome]


def _validation_hint(before: ProbeResult | None, after: ProbeResult | None) -> str:
    broken = next((r for r in (before, after) if r is not None and r.outcome is ProbeOutcome.ERROR), None)
    if broken is not None:
        lines = broken.detail.splitlines() or ["no output"]
        # a timeout is the reason, not the last line the probe printed before it
        return "the probe could not decide: " + (lines[0] if lines[0].startswith("timed out after") else lines[-1])
    assert before is not None and after is not None
    if before.outcome is ProbeOutcome.PASS:
        return "a probe that passes without the patch would drop a needed patch: make it test the bug itself"
    return "the probe still fails with the patch: make it test what the patch changes"
