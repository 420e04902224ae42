"""One command's probe workspace: each tree extracted once and shared by every probe run on it, runs in
parallel up to `jobs`, and the results of runs made ahead of the order that reads them.

The workspace is one folder ``$VPATCH_CACHE/probe-runs/run-<pid>-*``, owned through an flock for as long as the
command runs and removed when it ends; a command killed (even by SIGKILL) leaves it, and the next one removes
every such folder no one owns. A probe must not write into its tree: the next probe on that tree reads the same
files, and so do the other trees here (a tree is made from the nearest one already here, the files they share hard
links to one file: git.derive_tree); a tree found gone or incomplete after a run makes that run an error, never a
verdict.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from vpatch import git
from vpatch.base import Event, GitError, Reporter, cache_dir, child_env, silent
from vpatch.probes.env import own_run_folder, remove_stale_runs, venv_root
from vpatch.probes.outcome import ProbeKind
from vpatch.probes.zygote import Zygote

if TYPE_CHECKING:
    from typing import Self

    from vpatch.probes.file import Probe
    from vpatch.probes.runner import ProbeResult

_EXTRACTED = "extracted"  # beside a tree's folder, written once the tree is whole
T = TypeVar("T")
R = TypeVar("R")


def zygote_default() -> bool:
    """Whether probe runs go through a warm interpreter: VPATCH_PROBE_ZYGOTE=1 / 0, else the default."""
    value = os.environ.get("VPATCH_PROBE_ZYGOTE", "").strip()
    return ZYGOTE_DEFAULT if not value else value not in ("0", "no", "false", "off")


# On: measured to pay on this 2-core machine at load ~2 (docs/benchmarks.md: scripts/bench-probes, 1.96x against
# the same runs without it); VPATCH_PROBE_ZYGOTE=0 turns it off.
ZYGOTE_DEFAULT = True
# A warm interpreter imports every module the venv's probes import, checked, before its first fork; with no recorded
# list it learns them from its first runs, which go fresh meanwhile (a first learning of the shipped probes' ~3,900
# modules took 13-14 s on two cores, the venv byte-compiled). It pays back only over rounds of runs: from this many
# on (runs / the jobs that get a core, rounded up), for a command that knows its runs ahead. Measured again with the
# venv byte-compiled, on two cores, the list removed before each run, alternating 3 times (`probe check 0003
# --no-cache`, VPATCH_PROBE_ZYGOTE=1 against 0): 3 rounds (6 runs) 21.7-25.1 s through it, 26.5-28.0 s fresh;
# 2 rounds (--no-upstream-tests, 4 runs) 19.7-20.2 s against 17.7-20.2 s; 1 round (2 runs) 9.8-10.9 s against
# 10.4-10.8 s: it pays from 3 rounds, as set.
ZYGOTE_ROUNDS = 3
# With a recorded list it pays from the first round: importing the list (4.8-5.5 s for 4,072 modules on two cores)
# overlaps the trees' extraction, and each forked run is ~1.3 s. Measured on two cores, the venv byte-compiled,
# alternating: `probe check 0003 --no-cache --no-hunks --no-upstream-tests` (2 runs, 1 round) 6.4-7.6 s through it,
# 8.0-10.2 s fresh; with `--jobs 3` (6 runs, 2 rounds) 10.4-11.5 s, 25.4-25.8 s fresh. (Before the venv was
# byte-compiled one round was about even, so it stayed fresh.)
LISTED_ROUNDS = 1
# A tree this many changed files away from one being written waits for it and is made from it (hard links)
NEAR_FILES = 200
# How long a run waits for a warm interpreter importing its recorded list (4-8 s for the shipped probes' ~2,800-4,000
# modules on two cores) before it goes fresh, and the runs after it stop waiting
LIST_WAIT_S = 60.0


def zygote_pays(runs: int, jobs: int | None, *, listed: bool = False) -> bool:
    """Whether a command that makes `runs` probe runs of one probe, `jobs` at a time (None: the cores), should run
    them through a warm interpreter: as VPATCH_PROBE_ZYGOTE says where it is set, else from ZYGOTE_ROUNDS rounds on,
    or LISTED_ROUNDS where its venv has a recorded list (`listed`: nothing to learn, seconds to import) (`vpatch
    probe check`: its sides, one run without each hunk, upstream's tests; docs/benchmarks.md, "probe check")."""
    if os.environ.get("VPATCH_PROBE_ZYGOTE", "").strip():
        return zygote_default()
    # more jobs than cores share the cores: 6 runs at once on 2 cores cost 3 rounds of each run's imports (`probe
    # check 0003 --jobs 6 --no-cache`, 6 runs, on two cores: 25.5-25.8 s fresh, 10.6-11.1 s through it)
    cores = default_jobs()
    rounds = -(-runs // min(cores, cores if jobs is None else max(1, jobs)))
    return ZYGOTE_DEFAULT and rounds >= (LISTED_ROUNDS if listed else ZYGOTE_ROUNDS)


def listed(probe: Probe | None, cache: Path | None = None) -> bool:
    """Whether `probe` runs in a venv, built already, whose warm interpreter has a recorded list to import
    (`zygote_pays`'s `listed`)."""
    if probe is None or probe.kind is not ProbeKind.COMMAND or probe.fresh_process:
        return False
    python = venv_root(cache) / probe.environment().key() / "bin" / "python"
    return python.exists() and Zygote.has_list(python)


# Probe runs and upstream's tests run offline (Session.run_env): the hub's clients (huggingface_hub, transformers,
# datasets) answer from their cache or fail at once instead of retrying for minutes, and nothing reports usage. What
# else reaches for the network is stopped by the tests' runner (probes/child/upstream_tests.py).
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def default_jobs() -> int:
    """As many runs at once as this process may use cores (a container's or taskset's limit, not the host's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class Places:
    """A session's `jobs` places for processes. A run waits for a free one (`hold`), a probe's run before upstream's
    tests (`first`: what a probe says may start more runs, such as one per hunk, and tests start none); a warm
    interpreter's imports `take` one at once, even when all are held (it holds the lock the runs test to go fresh,
    so it must not wait for them): the runs that come after wait for the next free one."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.used = 0
        self._first = 0  # `first` runs waiting for a place
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def hold(self, *, first: bool = False) -> Iterator[None]:
        with self._changed:
            self._first += first
            try:
                self._changed.wait_for(lambda: self.used < self.jobs and (first or not self._first))
            finally:
                self._first -= first
            self.used += 1
        try:
            yield
        finally:
            self.free()

    @contextlib.contextmanager
    def take(self) -> Iterator[None]:
        self.add()
        try:
            yield
        finally:
            self.free()

    def add(self) -> None:
        """Take a place at once (`take` without its block: the caller frees it)."""
        with self._changed:
            self.used += 1

    def free(self) -> None:
        with self._changed:
            self.used -= 1
            self._changed.notify_all()  # the one it goes to depends on who waits (`first`)


class Running:
    """One subject's process runs (a probe's on a tree, upstream's tests on a tree) in a session's places: `running`
    is said when the first of them gets its place, and `seconds` is the time they held places. The time waited for a
    place is the other runs' (said `running` meanwhile, a command would show more runs at once than --jobs); its
    tree, extracted before, is the command's (`getting`: said while the run waits for it)."""

    def __init__(self, report: Reporter, subject: str, detail: str = "") -> None:
        self.report = report
        self.subject = subject
        self.detail = detail
        self.seconds = 0.0
        self._said = False

    def tree(self, session: Session, repo: Path, tree: str) -> Path:
        """`session.tree`, said `getting its tree` where it is not extracted yet (seconds, before any place)."""
        if not session.ready(tree):
            self.report(Event(self.subject, "getting its tree"))
        return session.tree(repo, tree)

    @contextlib.contextmanager
    def place(self, session: Session, *, first: bool = False) -> Iterator[None]:
        """Hold one of `session`'s places for one process of this subject (`first`: Session.slot)."""
        with session.slot(first=first):
            started = time.monotonic()
            if not self._said:
                self._said = True
                self.report(Event(self.subject, "running", self.detail))
            try:
                yield
            finally:
                self.seconds += time.monotonic() - started


class Session:
    """Shared extracted trees and a pool of `jobs` runs for the length of a `with` block."""

    def __init__(self, *, cache: Path | None = None, jobs: int | None = None, zygote: bool | None = None,
                 report: Reporter = silent) -> None:
        self.cache = cache_dir() if cache is None else cache
        self.jobs = default_jobs() if jobs is None else max(1, jobs)
        # a warm interpreter per probe venv (probes/zygote.py); VPATCH_PROBE_ZYGOTE=0/1 overrides the default
        self.zygote = zygote_default() if zygote is None else zygote
        self.report = report
        # venv python -> its one warm interpreter, for probe runs and upstream's tests alike (the same environment)
        self._zygotes: dict[Path, Zygote] = {}
        self._starting: dict[Path, threading.Thread] = {}  # -> the thread that starts it
        self._awaited: dict[Path, bool] = {}  # -> whether runs wait for its start (it imports a recorded list)
        self._zygote_lock = threading.Lock()
        # a warm interpreter starts on a thread that may outlive the command: its reports end with the command,
        # whose output stream may be closed by then (_reporting, _while_open)
        self._reporting = False
        self._report_gate = threading.Lock()
        self.cancel = threading.Event()  # set when the command ends: running probes end with it
        self.ahead: dict[Path, ProbeResult] = {}  # result-cache entry -> a result run ahead, not yet read
        self._root: Path | None = None
        self._owner: int | None = None  # the flock that owns the workspace folder
        self._open = False
        self._trees: dict[str, Path] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._making: dict[str, int] = {}  # trees being written now -> the order they were begun in
        self._begun = 0
        self._guard = threading.Lock()
        self._batches: set[threading.Event] = set()  # the cancel events of the runs going now
        # a process run (a probe's, upstream's tests') holds one while it runs: at most `jobs` at once, however many
        # batches go side by side (probe check's sides and hunks beside upstream's tests); a warm interpreter's
        # imports hold one too
        self._places = Places(self.jobs)

    def __enter__(self) -> Self:
        # A killed command leaves its workspace (a tree is 100+ MB): the folder's pid says when it is stale.
        remove_stale_runs(self.cache / "probe-runs")
        self._open = True
        self._reporting = True
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        with self._report_gate:
            self._reporting = False
        self.cancel.set()
        for batch in list(self._batches):
            batch.set()
        with self._zygote_lock:
            self._open = False  # a zygote still starting closes itself when it is ready (_start_zygote)
            for zygote in self._zygotes.values():
                zygote.close()
            self._zygotes.clear()
        with self._guard:
            if self._root is not None:
                shutil.rmtree(self._root, ignore_errors=True)
                self._root = None
            if self._owner is not None:
                os.close(self._owner)
                self._owner = None
            self._trees.clear()

    def zygote_for(self, python: Path, report: Reporter = silent, *, wait: bool = False) -> Zygote | None:
        """The warm interpreter of the venv of `python` once it is warm, else None: the run goes fresh (also where
        the session runs fresh processes, or that zygote is broken). The first ask starts it (`warm_up`). A run
        waits while it imports a recorded list (seconds, each module checked, none tried apart: shorter than the
        run's own imports in a fresh process beside it, which would slow it on the same cores), never while it
        learns: with no list yet, or one that does not hold, the run goes fresh. `wait`: wait for it to be ready
        whatever it does (a test that needs its runs to go through it)."""
        starting = self.warm_up(python, report)
        if starting is None:
            return None
        if wait:
            starting.join()
        elif self._awaited.get(python) and starting.is_alive():
            starting.join(LIST_WAIT_S)
            if starting.is_alive():  # a list that takes this long: the runs stop waiting for it
                self._awaited[python] = False
        with self._zygote_lock:
            found = self._zygotes.get(python)
        return None if found is None or found.broken is not None else found

    def warm_up(self, python: Path, report: Reporter = silent) -> threading.Thread | None:
        """Start the warm interpreter of the venv of `python` on a thread of its own, once per session (the thread;
        None where the session runs fresh processes): called as soon as the venv exists, so that it imports its
        recorded list while the first runs extract their trees (they wait for that list, `zygote_for`), or learns
        beside them, which go fresh until it is warm. One for the probe runs and upstream's
        tests alike: both run with `run_env`, and it learns one list, what either imports. Its progress goes to the
        session's reporter, else to `report` (the first run's: the commands report probe runs that way)."""
        if not self.zygote:
            return None
        with self._zygote_lock:
            found = self._starting.get(python)
        if found is not None:
            return found
        env = self.run_env()
        with self._zygote_lock:
            assert self._open, "a Session is used inside its with block"
            found = self._starting.get(python)
            if found is None:
                self._awaited[python] = Zygote.has_list(python)
                reporter = self._while_open(self.report if self.report is not silent else report)
                found = self._starting[python] = threading.Thread(
                    target=self._start_zygote, args=(python, env, reporter), name="zygote-start", daemon=True)
                if self.jobs > 1:  # its first imports take a place before the runs asking next do (_learning_place)
                    self._places.add()  # freed by _start_zygote
                found.start()
        return found

    def _learning_place(self) -> contextlib.AbstractContextManager[None]:
        # a warm interpreter's imports (a recorded list, then what runs teach it) are a process's work beside the
        # runs: they take one of the session's places where there are two or more, so that the runs going fresh
        # meanwhile do not starve them (a first run's learning took 63 s beside two fresh runs on two cores, 19 s on
        # a quiet one); with one place, the runs go on beside them and nothing waits for the imports
        return self._places.take() if self.jobs > 1 else contextlib.nullcontext()

    def _while_open(self, reporter: Reporter) -> Reporter:
        """`reporter`, silent once the command has ended (a zygote's thread reports after it, to a closed stream)."""

        def report(event: Event) -> None:
            with self._report_gate:
                if self._reporting:
                    reporter(event)

        return report

    def _start_zygote(self, python: Path, env: dict[str, str], reporter: Reporter) -> None:
        try:
            zygote = Zygote(python, env=env, report=reporter, wait_for_imports=False, place=self._learning_place)
        finally:
            if self.jobs > 1:
                self._places.free()  # the place warm_up took for its first imports
        with self._zygote_lock:
            if not self._open:  # the command ended meanwhile
                zygote.close()
                return
            self._zygotes[python] = zygote
        if zygote.broken is not None:
            reporter(Event(zygote.subject, "fresh processes", zygote.broken, final=True))

    def run_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of every run in a probe venv, probes and upstream's tests, fresh or in the warm
        interpreter (PYTHONPATH aside, `extra` on top): offline (OFFLINE: evidence never waits on the network nor
        depends on it), HOME a folder of this session's, so that no run writes into the user's home, the same for
        all its runs so that they share one warm interpreter (a module such as huggingface_hub reads HOME when it is
        imported)."""
        with self._guard:
            assert self._open, "a Session is used inside its with block"
            if self._root is None:
                self._root, self._owner = own_run_folder(self.cache / "probe-runs", f"run-{os.getpid()}-")
            home = self._root / "home"
        home.mkdir(exist_ok=True)
        return child_env({"PYTHONDONTWRITEBYTECODE": "1", "HOME": str(home), **OFFLINE, **(extra or {})})

    @contextlib.contextmanager
    def slot(self, *, first: bool = False) -> Iterator[None]:
        """Hold one of the session's `jobs` places for a process run (waiting for one to be free; `first`, a probe's
        run: before the runs of upstream's tests that wait too)."""
        with self._places.hold(first=first):
            yield

    @property
    def busy(self) -> int:
        """How many of the session's places are held now (runs, and a warm interpreter's imports)."""
        return self._places.used

    def zygotes(self) -> list[Zygote]:
        """The warm interpreters started so far (broken ones too)."""
        with self._zygote_lock:
            return list(self._zygotes.values())

    def tree(self, repo: Path, tree: str) -> Path:
        """The root of `tree` extracted in the workspace: the first caller extracts it, the others wait for it."""
        with self._guard:
            assert self._open, "a Session is used inside its with block"
            if self._root is None:  # made on the first tree: a status without command probes makes none
                self._root, self._owner = own_run_folder(self.cache / "probe-runs", f"run-{os.getpid()}-")
            root = self._root
            lock = self._locks.setdefault(tree, threading.Lock())
        with lock:
            if tree not in self._trees or not self.intact(tree):
                dest = root / tree / "tree"
                (root / tree / _EXTRACTED).unlink(missing_ok=True)
                if dest.exists():  # an extraction that failed half-way
                    shutil.rmtree(dest)
                self._make(repo, tree, dest)
                (root / tree / _EXTRACTED).touch()
                self._trees[tree] = dest
            return self._trees[tree]

    def _make(self, repo: Path, tree: str, dest: Path) -> None:
        """Extract `tree` at `dest`: from the tree here that differs least from it (a patched tree from its base: a
        file or two; one release from another: about 40% of vLLM's files), else whole. A tree a few files away from
        one begun before it and still being written waits for that one and is made from it: two sides of a probe
        asked for at once were two whole extractions (~2.5 CPU-seconds each on vLLM's 8,500 files), beside the warm
        interpreter's imports on the same cores."""
        with self._guard:
            others = [t for t in self._trees if t != tree and self.intact(t)]
            self._begun += 1
            order = self._making[tree] = self._begun
            earlier = [t for t, begun in self._making.items() if begun < order]
        try:
            self._make_from(repo, tree, dest, others, earlier)
        finally:
            with self._guard:
                del self._making[tree]

    def _make_from(self, repo: Path, tree: str, dest: Path, others: list[str], earlier: list[str]) -> None:
        best: tuple[str, list[tuple[str, str]]] | None = None
        for other in others:
            try:
                changes = git.tree_changes(repo, other, tree)
            except GitError:  # not a tree of this repository
                continue
            if best is None or len(changes) < len(best[1]):
                best = (other, changes)
        if best is None or len(best[1]) > NEAR_FILES:
            for other in earlier:  # never one begun after it: two trees never wait for each other
                try:
                    changes = git.tree_changes(repo, other, tree)
                except GitError:
                    continue
                if len(changes) <= NEAR_FILES and (best is None or len(changes) < len(best[1])):
                    with self._locks[other]:  # its extraction ends
                        pass
                    if self.intact(other):
                        best = (other, changes)
        if best is not None:
            try:
                git.derive_tree(repo, self._trees[best[0]], best[0], best[1], tree, dest)
                return
            except OSError:  # a file of that tree is gone (a run removed it): this one is written whole
                shutil.rmtree(dest, ignore_errors=True)
        git.extract_tree(repo, tree, dest)

    def ready(self, tree: str) -> bool:
        """Whether `tree` is extracted here already, whole (`tree` answers at once)."""
        with self._guard:
            done = tree in self._trees
        return done and self.intact(tree)

    def intact(self, tree: str) -> bool:
        """Whether `tree`, extracted here, is still whole: its folder and the mark written after its extraction
        are there (another process that removed the workspace took them; a probe's result there is no evidence)."""
        found = self._trees.get(tree)
        return found is not None and found.is_dir() and (found.parent / _EXTRACTED).is_file()

    def map(self, fn: Callable[[T, threading.Event], R], items: Sequence[T],
            stop: Callable[[int, R], bool] | None = None) -> list[R | None]:
        """`fn(item, cancel)` on every item, `jobs` at a time; the results in the items' order. Once `stop(index,
        result)` holds, `cancel` is set for the runs still going and those not started are left out (None).
        The first exception cancels the runs still going and is raised."""
        cancel = threading.Event()
        self._batches.add(cancel)
        if self.cancel.is_set():
            cancel.set()
        results: list[R | None] = [None] * len(items)
        try:
            if self.jobs <= 1 or len(items) <= 1:
                for i, item in enumerate(items):
                    results[i] = fn(item, cancel)
                    if stop is not None and stop(i, results[i]):  # type: ignore[arg-type]
                        break
                return results
            with ThreadPoolExecutor(max_workers=min(self.jobs, len(items)), thread_name_prefix="probe") as pool:
                futures = {pool.submit(fn, item, cancel): i for i, item in enumerate(items)}
                try:
                    for future in as_completed(futures):
                        if future.cancelled():
                            continue
                        index = futures[future]
                        result = results[index] = future.result()
                        if stop is not None and stop(index, result) and not cancel.is_set():
                            cancel.set()
                            for other in futures:
                                other.cancel()
                except BaseException:
                    cancel.set()
                    for other in futures:
                        other.cancel()
                    raise
            return results
        finally:
            self._batches.discard(cancel)
