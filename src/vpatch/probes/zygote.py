"""A warm interpreter per probe venv (the zygote): one process imports what the probes of that venv import, once,
and forks a child per probe run, so a run no longer pays ~5-10 s of third-party imports (torch, transformers).

Only its own vpatch talks to it: its socket lies in a 0700 folder, and it checks each client's credentials
(SO_PEERCRED: vpatch's uid and pid); any other client is refused, named on its report stream, and nothing it sent
is read. The child runs the probe as a fresh ``python probe.py`` would: its argv, ``__main__``, cwd, environment
(the variables the run was started with, PYTHONPATH to the tree), stdout and stderr merged into one pipe, its exit
code or signal, stdin /dev/null, random/numpy/torch generators seeded anew; its threads and exit handlers run at its
end, then it ends without the interpreter's teardown of the modules it inherited (objects still alive then are not
finalized: that teardown copied the whole inherited heap, 1-2.5 s a run), and its collections pass over the
preloaded heap (frozen before the fork). Like the runner's supervisor for a fresh
run, a keeper process between the zygote and the probe leads a session of its own and is the subreaper of what
the probe starts: the probe itself is no group leader (setsid works), and the end of the run - its exit, a
timeout, the zygote's end - kills everything the run started, daemons and new sessions included.

What to preload is measured, not listed: each child reports the modules it imported from the venv or the
interpreter's library (never ``vllm`` nor a tree's), and the zygote preloads them only after trying them apart,
in a child of its own: each package with the packages it imports (those first, each alone, where the import left a
trace, so that the trace lands on its package), and only when its import leaves no trace -
no thread, no module from elsewhere, no rebound or added name in builtins or in a venv package, no process-wide
setting changed (environment, cwd, umask, signal handlers, sys.path and import hooks, logging's root, warnings
made errors, torch's default dtype, grad mode, seed or threads, numpy's error and print options ...). Three traces
are known inert and not counted, each matched exactly: torch._dynamo's guard around torch.manual_seed and its
TORCHINDUCTOR_CACHE_DIR (set again in each run's environment), and transformers' finder of its renamed modules,
last in sys.meta_path (every probe of vLLM imports both, 1.6 s a run). What passed is kept, in the order it was
imported, beside the venv (``vpatch-preload.json``), and imported by the next command's zygote with the same check;
a list that does not hold (or is malformed) is measured again, and what an older check refused is tried again.

Anything else falls back to a fresh process: a command that is not ``{python} script.py ...``, a probe that says
``fresh_process: true``, a run whose environment differs from the zygote's in more than PYTHONPATH (a module
preloaded under other variables would not see them), and a zygote that cannot start, refuses, dies or stops
answering (the run it was doing is run again, fresh; the session says so once).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vpatch.base import ChildProcess, Event, ProcessError, Reporter, atomic_write, silent
from vpatch.probes.child import ZYGOTE_SERVER

PRELOAD_FILE = "vpatch-preload.json"
# A second list an older vpatch kept for upstream's tests in a warm interpreter of their own: nothing reads it since
# the two share one interpreter and one list; removed where the one list is saved
OLD_PRELOAD_FILES = ("vpatch-preload-upstream-tests.json",)
# The leak check's version, recorded with what it refused: 2 knows the inert traces of torch._dynamo and transformers,
# 3 also transformers executed again by its own processing_utils, 4 learns a package with what it imports and puts a
# trace on the package that left it (3 refused a package's whole group with a dependency's trace: all of torch, 1,406
# modules, in a list learned beside upstream's tests)
LEAK_RULES = 4
# Set in the zygote (not in what a probe sees): a BLAS or OpenMP pool started at import would not survive fork.
THREAD_VARS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_SUBJECT = "probe zygote"
WEDGED_S = 600.0  # a zygote that takes longer to import is wedged: the runs go fresh
ANSWER_S = 30.0  # a zygote forks a run, and passes on its status, in milliseconds: one that takes this long is stopped
DRAIN_S = 10.0  # after a run is ended, how long its output may take to close
# Names per preload request: a message of a Unix socket is bounded (its send buffer). A first learning of the shipped
# probes' ~3,900 modules is 8 requests; the runs after the first are forked with what it holds by then.
CHUNK = 500


@dataclass(frozen=True)
class ZygoteRan:
    """A run in a child of the zygote: its exit code (negative: the signal), its merged output."""

    returncode: int
    output: bytes
    timed_out: bool = False
    cancelled: bool = False


class Zygote:
    """One warm interpreter of one probe venv, for the length of a session; `run` is safe from many threads."""

    def __init__(self, python: Path, *, env: Mapping[str, str], report: Reporter = silent,
                 wait_for_imports: bool = True,
                 place: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext) -> None:
        self.python = python
        self.place = place  # held while it learns (a session's place for a process: workspace.Places.take)
        # False: a run that comes while the zygote imports (what runs taught it) goes fresh instead of waiting
        # (`run` answers None), so that no run waits on learning; a session's zygotes are made so
        self.wait_for_imports = wait_for_imports
        self.env = dict(env)  # what a run must be started with (PYTHONPATH aside) to run here
        self.report = report
        self._folder: Path | None = None
        self.address = ""  # its socket
        self.broken: str | None = None  # why it no longer takes runs
        self.runs = 0  # runs it ran to the end (a test reads that the runs went through it)
        self.went_fresh = 0  # runs that came while it imported, and went fresh rather than wait
        self.beside_learning = 0  # runs it forked while it learned (warm already), between its trials
        # True while it learns apart what runs taught it, with modules preloaded before: runs go on in it meanwhile
        self._beside = False
        self.refusals: list[tuple[int, int]] = []  # (pid, uid) of clients it refused
        self.subject = _SUBJECT  # its progress lines' subject
        # the venv's one list: what probe runs and upstream's tests import (they run with one environment)
        self._file = python.parent.parent / PRELOAD_FILE
        self._lock = threading.Lock()  # held while the zygote imports: runs wait for it
        self._closed = False
        self._guard = threading.Lock()  # the modules runs reported, not yet preloaded
        self._pending: list[str] = []
        self._learning = False
        self._preloaded: set[str] = set()
        self._refused: set[str] = set()
        # what failed to import here (not recorded: the next zygote tries again) -> how many modules were preloaded
        # then: tried again only once more are (a module a later preload makes importable)
        self._failed: dict[str, int] = {}
        self._known: list[str] = []  # what was preloaded, in the order it was checked and imported
        recorded = self._recorded()
        self._refused = set(recorded.get("refused", []))
        known = [m for m in dict.fromkeys(recorded.get("preload", [])) if m not in self._refused]
        if not self._start():
            return
        if known and not self._preload(known, apart=False):
            # a list not in the order it was checked in (an older vpatch's), or one that no longer holds: a new
            # zygote learns it as it learns what runs import, each package tried apart; a session's in the
            # background (no run waits for learning: they go fresh until its first request is in, then fork between
            # its trials), one whose runs wait for its imports before it is handed out
            self._child.close()
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
            self.broken = None
            if self._start(again=True):
                again = [m for m in known if m not in self._refused]
                if self.wait_for_imports:
                    self._preload(again, apart=True)
                else:
                    self._learn_later(again)

    def _start(self, *, again: bool = False) -> bool:
        """Start the zygote process (False: it did not start, and `broken` says why). `again`: in place of one this
        Zygote started and closed (the recorded list did not hold)."""
        started = {**self.env, **{k: v for k, v in THREAD_VARS.items() if k not in self.env}}
        self._preloaded, self._known = set(), []
        try:
            # a folder only we may enter: the socket in it is reached by no other user, and the zygote serves only
            # us; the zygote removes it when it ends
            self._folder = Path(tempfile.mkdtemp(prefix=f"vpatch-zygote-{os.getpid()}-"))
            self.address = str(self._folder / "socket")
            # cwd: a folder with no probe code in it; the server drops its own folder from sys.path once started
            self._child = ChildProcess([str(self.python), str(ZYGOTE_SERVER), self.address, str(os.getpid())],
                                        cwd=self.python.parent.parent, env=started)
            ready = _line(self._child.stdout, ANSWER_S)
        except (ProcessError, OSError) as exc:
            self.broken = f"it did not start: {exc}"
            return False
        if not ready.startswith(b"ready"):
            self.broken = f"it did not start: {self._child.failed('no ready line').message}"
            return False
        self.pid = int(ready.split()[1])
        # one line per warm interpreter: a command that shares its session starts one per probe venv
        self.report(Event(self.subject, "started again" if again else "started", f"pid {self.pid}"))
        threading.Thread(target=self._watch, args=(self._child,), name="zygote-report", daemon=True).start()
        return True

    # -- the vpatch side of one run ---------------------------------------------------------------------------

    def fits(self, argv: Sequence[str], env: Mapping[str, str]) -> bool:
        """Whether a run of `argv` with `env` (the whole environment) may run here."""
        if self.broken is not None or len(argv) < 2 or argv[0] != str(self.python):
            return False
        if argv[1] == "-m":  # python -m module ...: a module of the venv or of the tree, run as __main__
            if len(argv) < 3 or not all(part.isidentifier() for part in argv[2].split(".")):
                return False
        elif argv[1].startswith("-") or not argv[1].endswith(".py"):
            return False
        ours = {k: v for k, v in self.env.items() if k != "PYTHONPATH"}
        theirs = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        ambient = self.env.get("PYTHONPATH", "")
        return ours == theirs and (not ambient or env.get("PYTHONPATH", "").endswith(ambient))

    def run(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float | None,
            cancel: threading.Event | None = None) -> ZygoteRan | None:
        """`argv` in a child; None when the zygote could not run it to the end, or (`wait_for_imports` False) is
        importing: run it fresh instead."""
        if not self.wait_for_imports and not self._lock.acquire(blocking=False):
            if not self._beside:
                self.went_fresh += 1
                return None  # its first learning: a fork of it would be as cold as a fresh process
            # warm, and learning what runs taught it: the zygote forks this run between its trials, with what it
            # had preloaded before them (zygote_server.apart), never after the learning
            self.beside_learning += 1
        else:
            # a preload in flight finishes first (the zygote does one thing at a time); one that never ends is a
            # wedged zygote, and the runs go fresh
            if self.wait_for_imports and not self._lock.acquire(timeout=WEDGED_S):
                self._break(f"it has been importing for over {WEDGED_S:g}s")
                return None
            self._lock.release()
        if self.broken is not None:
            return None
        read, write = os.pipe()
        try:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            conn.connect(self.address)
            request = {"argv": list(argv), "cwd": str(cwd), "env": dict(env)}
            socket.send_fds(conn, [json.dumps(request).encode()], [write])
        except OSError as exc:
            os.close(read)
            self._break(f"it does not answer ({exc})")
            return None
        finally:
            os.close(write)
        try:
            return self._follow(conn, read, timeout, cancel)
        finally:
            conn.close()
            os.close(read)

    def _follow(self, conn: socket.socket, read: int, timeout: float | None,
                cancel: threading.Event | None) -> ZygoteRan | None:
        reply = _message(conn, wait=ANSWER_S)
        early: list[str] = []
        while reply is not None and "modules" in reply:  # a child quicker than its zygote's reply
            early += _names(reply["modules"])
            reply = _message(conn, wait=ANSWER_S)
        if not reply or "pid" not in reply:
            self._break(str(reply.get("refused", "it refused the run")) if reply else "it did not answer")
            return None
        pid = int(str(reply["pid"]))
        deadline = None if timeout is None else time.monotonic() + timeout
        chunks: list[bytes] = []
        timed_out = cancelled = False
        ended: float | None = None  # when the run was ended: its output closes soon after, or is given up
        while True:
            wait = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
            ready, _, _ = select.select([read], [], [], wait)
            if ready:
                data = os.read(read, 1 << 16)
                if not data:
                    break
                chunks.append(data)
                continue
            if ended is None:
                if deadline is not None and time.monotonic() >= deadline:
                    timed_out = True
                elif cancel is not None and cancel.is_set():
                    cancelled = True
                if timed_out or cancelled:
                    _end_run(pid)
                    ended = time.monotonic()
            elif time.monotonic() - ended > DRAIN_S:
                _kill_group(pid)
                self._break(f"a run's output stayed open {DRAIN_S:g}s after it was ended")
                break
        status = None
        learned = early
        waited = 0.0
        while True:
            message = _message(conn, wait=ANSWER_S)
            if message is _WAITED and self._lock.locked() and waited < WEDGED_S:
                waited += ANSWER_S  # the zygote imports (what another run taught it) before it reaps
                continue
            if message is None or message is _WAITED:
                break
            if "modules" in message:
                learned += _names(message["modules"])
            if "status" in message:
                status = int(str(message["status"]))
                break
        _kill_group(pid)  # the keeper is gone: nothing of its session may stay
        if learned and status is not None and not (timed_out or cancelled):
            self._learn_later(learned)  # only what a run that ended on its own imported
        if status is None:
            if timed_out or cancelled:
                return ZygoteRan(124, b"".join(chunks), timed_out=timed_out, cancelled=cancelled)
            self._break("it did not pass on a run's status")
            return None
        self.runs += 1
        return ZygoteRan(os.waitstatus_to_exitcode(status), b"".join(chunks), timed_out=timed_out,
                         cancelled=cancelled)

    def settled(self, wait: float = WEDGED_S) -> bool:
        """Wait for the imports in flight (what runs taught it) to end, as the next run does; False: still going."""
        if not self._lock.acquire(timeout=wait):
            return False
        self._lock.release()
        return True

    # -- what to preload ----------------------------------------------------------------------------------------

    @staticmethod
    def has_list(python: Path) -> bool:
        """Whether the venv of `python` has a recorded preload list: a zygote started now imports it, checked,
        before its first run (seconds: no module tried apart), instead of learning what runs import."""
        try:
            data = json.loads((python.parent.parent / PRELOAD_FILE).read_bytes())
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and bool(data.get("preload"))

    def _recorded(self) -> dict[str, list[str]]:
        """The recorded preload list; a malformed one is ignored, with a warning naming it."""
        file = self._file
        try:
            raw = file.read_bytes()
        except OSError:
            return {}
        try:
            data = json.loads(raw)
        except ValueError as exc:
            data, why = None, f"not JSON ({exc})"
        else:
            why = "not an object of two lists of module names"
        if isinstance(data, dict) and all(isinstance(data.get(key, []), list)
                                          and all(isinstance(n, str) for n in data.get(key, []))
                                          for key in ("preload", "refused")):
            # what older rules refused is tried again under these (a trace they knew as inert is no longer one)
            return {"preload": list(data.get("preload", [])),
                    "refused": list(data.get("refused", [])) if data.get("rules") == LEAK_RULES else []}
        self.report(Event(self.subject, "warning", f"{file}: {why}; ignored (the list is measured again)",
                          final=True))
        return {}

    def _learn_later(self, modules: list[str]) -> None:
        """Preload what a run imported, on a thread of its own while the run's result goes on; the runs after it go
        fresh meanwhile (with `wait_for_imports`, they wait: see run). One such thread at a time takes what every
        run reported meanwhile."""
        with self._guard:
            # what it preloaded, refused or failed to import (until it preloads more) is nothing to learn: no lock
            # taken, so the runs after this one need not go fresh
            new = [m for m in modules if m not in self._preloaded and m not in self._refused
                   and self._failed.get(m) != len(self._preloaded)]
            if not new:
                return
            self._pending += new
            if self._learning:
                return
            self._learning = True
        self._lock.acquire()  # taken here, so that the next run waits; released by the importing thread
        # warm already (a session's zygote): the runs meanwhile go on in it, forked between its trials
        self._beside = bool(self._preloaded) and not self.wait_for_imports
        threading.Thread(target=self._learn_pending, name="zygote-preload", daemon=True).start()

    def _learn_pending(self) -> None:
        try:
            with self.place():
                self._learn_batches()
        finally:
            self._beside = False
            self._lock.release()

    def _learn_batches(self) -> None:
        while True:
            with self._guard:
                batch, self._pending = self._pending, []
                if not batch:
                    self._learning = False
                    return
            new = [m for m in dict.fromkeys(batch) if m not in self._preloaded and m not in self._refused
                   and self._failed.get(m) != len(self._preloaded)]
            if new and self.broken is None and not self._closed:
                self._preload(new, apart=True)

    def _preload(self, names: list[str], *, apart: bool) -> bool:
        """Ask the zygote to import `names` (before its next fork) and record what it said (under self._lock, or
        before any run). `apart`: names measured from runs, each tried in a child of the zygote first; else the
        recorded list, checked as it is imported. Only what the zygote imported clean is recorded. False: the zygote
        is broken, or unsafe (the recorded list did not hold)."""
        started = time.monotonic()
        self.report(Event(self.subject, "importing", f"{len(names)} modules its runs import"))
        loaded: list[str] = []
        failed: list[str] = []
        refused: dict[str, str] = {}
        unsafe = ""
        tops = sorted({n.split(".")[0] for n in names})  # the whole list's packages, whichever batch holds them
        barred = sorted(self._refused)  # a group that imports one of these is refused with it
        for first in range(0, len(names), CHUNK):
            try:
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                conn.connect(self.address)
                conn.send(json.dumps({"preload": names[first:first + CHUNK], "apart": apart, "tops": tops,
                                      "barred": barred}).encode())
                part = _message(conn, wait=WEDGED_S) or None
                conn.close()
            except OSError as exc:
                part, reason = None, str(exc)
            else:
                reason = "it ended, or took too long, while importing"
            if part is None:
                self._break(reason)  # nothing of this batch is recorded: an interrupted import teaches nothing
                return False
            loaded += _names(part.get("loaded"))
            if apart and loaded and not self.wait_for_imports and self._lock.locked():
                # its first learning, a request in: the runs from now on are forked with what it holds (see run)
                self._preloaded.update(loaded)
                self._beside = True
            failed += _names(part.get("failed"))
            found = part.get("refused")
            refused.update({str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {})
            if part.get("unsafe"):
                unsafe = str(part["unsafe"])
                # never again what left a trace or imports a module refused before (aiohttp imports frozenlist's);
                # a failure, an order or a package never learned is measured again
                if part.get("traced"):
                    refused.update((n, unsafe) for n in _names(part.get("at")))
                break
        self._preloaded.update(loaded)
        self._failed.update((name, len(self._preloaded)) for name in failed)
        known = set(self._known)
        self._known += [m for m in dict.fromkeys(loaded) if m not in known]
        self._refused.update(refused)
        if refused:
            first_refused = next(iter(refused.items()))
            self.report(Event(self.subject, "not preloaded", f"{len(refused)} modules, e.g. {first_refused[0]}: "
                              f"{first_refused[1]}", final=True))
        self._save()
        if unsafe and apart:
            self._break(f"its imports are not safe ({unsafe})")
            return False
        if unsafe:  # the caller starts a new zygote
            self.report(Event(self.subject, "the recorded preload list does not hold", f"{unsafe}; measured again",
                              final=True))
            return False
        self.report(Event(self.subject, "warm", f"{len(self._preloaded)} modules preloaded", final=True,
                          seconds=time.monotonic() - started))
        return True

    def _save(self) -> None:
        data = {"preload": [m for m in self._known if m not in self._refused], "refused": sorted(self._refused),
                "rules": LEAK_RULES}
        try:
            atomic_write(self._file, json.dumps(data, indent=0).encode() + b"\n")
        except OSError:
            return  # a read-only venv: the next command measures again
        for name in OLD_PRELOAD_FILES:
            with contextlib.suppress(OSError):
                (self._file.parent / name).unlink(missing_ok=True)

    def _watch(self, child: ChildProcess) -> None:
        """Read the zygote's report stream: each client it refused."""
        try:
            for line in child.stdout:
                words = line.split()
                if len(words) == 3 and words[0] == b"refused":
                    pid, uid = int(words[1]), int(words[2])
                    self.refusals.append((pid, uid))
                    self.report(Event(self.subject, "refused a client", f"pid {pid}, uid {uid}: not this vpatch",
                                      final=True))
        except (OSError, ValueError):
            pass

    def _break(self, why: str) -> None:
        if self.broken is None and not self._closed:
            self.broken = why
            self.report(Event(self.subject, "fresh processes from now on", why, final=True))

    def close(self) -> None:
        """The zygote sees the end of its input, ends what it still runs and exits."""
        self._closed = True
        child = getattr(self, "_child", None)
        if child is not None:
            child.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)


def _line(stream: Any, wait: float) -> bytes:
    """The next line of a child's stdout, or b"" when none comes within `wait` seconds."""
    ready, _, _ = select.select([stream], [], [], wait)
    return stream.readline() if ready else b""


def _names(value: object) -> list[str]:
    return [n for n in value if isinstance(n, str)] if isinstance(value, list) else []


_WAITED: dict[str, Any] = {}  # what `_message` answers when nothing came within its wait


def _message(conn: socket.socket, wait: float | None = None) -> dict[str, Any] | None:
    """The next message on `conn` (None: it closed or said no JSON object; _WAITED: nothing came within `wait`)."""
    conn.settimeout(wait)
    try:
        data = conn.recv(1 << 20)
    except TimeoutError:
        return _WAITED
    except OSError:
        return None
    if not data:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _end_run(pid: int) -> None:
    """Ask a run's keeper to end the run with everything it started (its own session and any other)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
