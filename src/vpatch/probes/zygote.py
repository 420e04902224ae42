"""A warm interpreter per probe venv (the zygote): one process imports what the probes of that venv import, once,
and forks a child per probe run, so a run no longer pays ~5-10 s of third-party imports (torch, transformers).

Only its own vpatch talks to it: its socket lies in a 0700 folder, and it checks each client's credentials
(SO_PEERCRED: vpatch's uid and pid); any other client is refused, named on its report stream, and nothing it sent
is read. The child runs the probe as a fresh ``python probe.py`` would: its argv, ``__main__``, cwd, environment
(the variables the run was started with, PYTHONPATH to the tree), stdout and stderr merged into one pipe, its exit
code or signal, stdin /dev/null, random/numpy/torch generators seeded anew. Like the runner's supervisor for a fresh
run, a keeper process between the zygote and the probe leads a session of its own and is the subreaper of what
the probe starts: the probe itself is no group leader (setsid works), and the end of the run - its exit, a
timeout, the zygote's end - kills everything the run started, daemons and new sessions included.

What to preload is measured, not listed: each child reports the modules it imported from the venv or the
interpreter's library (never ``vllm`` nor a tree's), and the zygote preloads them only after trying them apart,
in a child of its own: each package after the packages it imports, and only when its import leaves no trace -
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

import json
import os
import select
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vpatch.base import ChildProcess, Event, ProcessError, Reporter, atomic_write, silent

PRELOAD_FILE = "vpatch-preload.json"
TESTS_PRELOAD_FILE = "vpatch-preload-upstream-tests.json"  # the upstream-tests zygote's (pytest and what tests import)
# The leak check's version, recorded with what it refused: 2 knows the inert traces of torch._dynamo and transformers,
# 3 also transformers executed again by its own processing_utils
LEAK_RULES = 3
# Set in the zygote (not in what a probe sees): a BLAS or OpenMP pool started at import would not survive fork.
THREAD_VARS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_SUBJECT = "probe zygote"
WEDGED_S = 600.0  # a zygote that takes longer to import is wedged: the runs go fresh
ANSWER_S = 30.0  # a zygote forks a run, and passes on its status, in milliseconds: one that takes this long is stopped
DRAIN_S = 10.0  # after a run is ended, how long its output may take to close


@dataclass(frozen=True)
class ZygoteRan:
    """A run in a child of the zygote: its exit code (negative: the signal), its merged output."""

    returncode: int
    output: bytes
    timed_out: bool = False
    cancelled: bool = False


class Zygote:
    """One warm interpreter of one probe venv, for the length of a session; `run` is safe from many threads."""

    def __init__(self, python: Path, *, env: Mapping[str, str], report: Reporter = silent, subject: str = _SUBJECT,
                 preload_file: str = PRELOAD_FILE) -> None:
        self.python = python
        self.env = dict(env)  # what a run must be started with (PYTHONPATH aside) to run here
        self.report = report
        self._folder: Path | None = None
        self.address = ""  # its socket
        self.broken: str | None = None  # why it no longer takes runs
        self.runs = 0  # runs it ran to the end (a test reads that the runs went through it)
        self.refusals: list[tuple[int, int]] = []  # (pid, uid) of clients it refused
        self.subject = subject  # its progress lines' subject: "probe zygote", "upstream-tests zygote"
        self._file = python.parent.parent / preload_file  # its own: two kinds would overwrite each other's list
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
        if not recorded and preload_file != PRELOAD_FILE:
            # a zygote of another kind (upstream's tests) starts from the probes' list, checked as it is imported:
            # what vllm imports, tests import too; it then learns only its own (pytest), not all 4,000 apart
            recorded = {"preload": self._recorded(python.parent.parent / PRELOAD_FILE).get("preload", [])}
        self._refused = set(recorded.get("refused", []))
        known = [m for m in recorded.get("preload", []) if m not in self._refused]
        if not self._start():
            return
        if known and not self._preload(known, apart=False):
            # a list not in the order it was checked in (an older vpatch's), or one that no longer holds: a new
            # zygote learns it as it learns what runs import, each package tried apart
            self._child.close()
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
            self.broken = None
            if self._start(again=True):
                self._preload([m for m in known if m not in self._refused], apart=True)

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
            # cwd: a folder with no probe code in it (sys.path's first entry is dropped anyway)
            self._child = ChildProcess([str(self.python), "-c", _SERVER, self.address, str(os.getpid())],
                                        cwd=self.python.parent.parent, env=started,
                                        shown=[str(self.python), "<probe zygote>"])
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
        """`argv` in a child; None when the zygote could not run it to the end (run it fresh instead)."""
        # a preload in flight finishes first (the zygote does one thing at a time); one that never ends is a
        # wedged zygote, and the runs go fresh
        if not self._lock.acquire(timeout=WEDGED_S):
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

    def _recorded(self, file: Path | None = None) -> dict[str, list[str]]:
        """The recorded preload list (its own, or `file`); a malformed one is ignored, with a warning naming it."""
        file = self._file if file is None else file
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
        """Preload what a run imported, on a thread of its own while the run's result goes on; the runs after it
        wait for the zygote (see run). One such thread at a time takes what every run reported meanwhile."""
        with self._guard:
            self._pending += modules
            if self._learning:
                return
            self._learning = True
        self._lock.acquire()  # taken here, so that the next run waits; released by the importing thread
        threading.Thread(target=self._learn_pending, name="zygote-preload", daemon=True).start()

    def _learn_pending(self) -> None:
        try:
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
        finally:
            self._lock.release()

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
        for first in range(0, len(names), 500):  # a message of a Unix socket is bounded (its send buffer)
            try:
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                conn.connect(self.address)
                conn.send(json.dumps({"preload": names[first:first + 500], "apart": apart, "tops": tops,
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
        self._known += [m for m in loaded if m not in known]
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
            pass  # a read-only venv: the next command measures again

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


# The zygote, run by the probe venv's python with `-c` (so no folder of vpatch's is on its sys.path). It listens on a
# socket in a 0700 folder of vpatch's and serves only vpatch (SO_PEERCRED: our uid and vpatch's pid); anything
# else is refused and named on its report stream: "refused <pid> <uid>". {"preload": [names], "apart": bool,
# "tops": [the whole list's packages], "barred": [modules refused]} -> {"loaded", "refused": {name: why}, "failed",
# "unsafe"}; {"argv", "cwd", "env"} with the run's output pipe ->
# {"pid"}, then the child's {"modules"} and the zygote's {"status"}. It ends, ending its runs, when the pipe it
# got as stdin (vpatch) closes: vpatch ended, even by SIGKILL. Its own stdin and stdout are /dev/null and stderr:
# a module that reads stdin at import reads nothing, one that prints cannot garble the report stream.
# What started a run ends it whole: every process below this one, reparented here (a subreaper) when their parents
# ended, daemons in sessions of their own included. Shared by the zygote's keepers and the runner's supervisor.
REAPER = r"""
import os, signal, time


def descendants():
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier and p not in found}
        found |= frontier
    return found


def end_all():
    # Kill everything this keeper's run started, daemons and new sessions included (they were reparented here).
    for _ in range(200):
        found = descendants()
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        time.sleep(0.005)
"""

_SERVER = REAPER + r"""
import ctypes, gc, importlib, importlib.util, json, os, random, runpy, select, signal, socket, struct, sys, time, types

ADDRESS, VPATCH = sys.argv[1], int(sys.argv[2])
sys.path[:] = [p for p in sys.path[1:]]
AMBIENT = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
BASE = [p for p in sys.path if p not in AMBIENT]
ROOTS = tuple(sorted({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                             sys.base_exec_prefix)}))
ZYGOTE = os.getpid()
STARTED = dict(os.environ)  # the environment it was started with: the runs' own, PYTHONPATH aside
DUMPS, LOADS = json.dumps, json.loads  # a probe may replace json's functions in its child, never ours
LIFE = os.dup(0)  # vpatch's end of this pipe closes when vpatch ends
REPORT = os.dup(1)
_null = os.open(os.devnull, os.O_RDWR)
os.dup2(_null, 0)
os.dup2(2, 1)
os.close(_null)
sys.stdin = open(0, closefd=False)
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C ends vpatch, and so this zygote; a child restores it
libc = ctypes.CDLL(None, use_errno=True)


def leave():
    # vpatch ended (maybe killed): end here, and take the socket and its folder along
    for remove in (os.unlink, os.rmdir):
        try:
            remove(ADDRESS if remove is os.unlink else os.path.dirname(ADDRESS))
        except OSError:
            pass
    os._exit(0)


def say(line):
    os.write(REPORT, (line + "\n").encode())


def threads():
    return len(os.listdir("/proc/self/task"))


def inside(module):
    # Whether a module comes from the venv or the interpreter's library (or from no file at all).
    paths = [module.__file__] if getattr(module, "__file__", None) else list(getattr(module, "__path__", None) or [])
    return all(os.path.realpath(p).startswith(ROOTS) for p in paths if isinstance(p, str))


def foreign(name, module):
    return name == "vllm" or name.startswith("vllm.") or not inside(module)


# -- the leak check: what an import may not change in what was there before it ------------------------------------

# Process-wide settings a module holds outside its own bindings, read when that module is loaded.
SETTINGS = {
    "torch": ("get_default_dtype", "is_grad_enabled", "are_deterministic_algorithms_enabled", "get_num_threads",
              "get_default_device", "initial_seed"),  # a seed set at import is one a probe could rely on
    "numpy": ("geterr", "get_printoptions"),
    "socket": ("getdefaulttimeout",),
    "sys": ("getrecursionlimit", "getswitchinterval", "gettrace", "getprofile", "get_int_max_str_digits"),
    "gc": ("isenabled", "get_threshold"),
}


def settings():
    inert = inert_environ()
    seen = {"cwd": os.getcwd(), "environ": {k: v for k, v in os.environ.items() if k not in inert},
            "path": list(sys.path),
            "meta_path": [id(f) for f in sys.meta_path if not inert_finder(f)],
            "path_hooks": [id(h) for h in sys.path_hooks],
            "signals": [signal.getsignal(s) for s in sorted(signal.valid_signals())
                        if s not in (signal.SIGKILL, signal.SIGSTOP)]}
    with open("/proc/self/status") as status:
        seen["umask"] = [line for line in status if line.startswith("Umask")]
    warnings = sys.modules.get("warnings")
    # a warning filter changes what stderr shows, no exit code, unless it turns warnings into errors
    seen["warnings"] = [f for f in warnings.filters if f[0] == "error"] if warnings is not None else []
    logging = sys.modules.get("logging")
    if logging is not None:
        seen["logging"] = (logging.root.level, list(logging.root.handlers), logging.root.disabled)
    decimal = sys.modules.get("decimal")
    if decimal is not None:  # its flags aside: they say what arithmetic ran, not how the next one runs
        context = decimal.getcontext()
        seen["decimal"] = (context.prec, context.rounding, context.Emin, context.Emax, context.capitals,
                           context.clamp, repr(context.traps))
    for owner, getters in SETTINGS.items():
        module = sys.modules.get(owner)
        for getter in getters if module is not None else ():
            try:
                seen[f"{owner}.{getter}()"] = repr(getattr(module, getter)())
            except Exception:
                pass
    return seen


VENV = os.path.realpath(sys.prefix) + os.sep


def watched(name, module):
    # Whose bindings an import may not change: builtins and the venv's packages. The interpreter's own library is
    # not watched: torch rebinds inspect.getfile, typing_extensions typing's helpers, and a probe imports them.
    if name == "builtins":
        return True
    where = getattr(module, "__file__", None)
    return isinstance(where, str) and os.path.realpath(where).startswith(VENV) and isinstance(
        getattr(module, "__dict__", None), dict)


def bindings(names=None):
    # each watched module's bindings, and the module itself (one executed again is a new object in sys.modules)
    return {name: (module, dict(vars(module))) for name, module in list(sys.modules.items())
            if (names is None or name in names) and watched(name, module)}


# Traces two packages leave on every import, each matched exactly, and inert for a run that does not import the
# package (a run that does gets the same in a fresh process): without them the zygote would import torch._dynamo
# (with torch._inductor) and transformers in every run, about 1.6 s of each probe run of vLLM, whose every
# import of vllm imports both.
def inert_rebinding(name, key, old, new):
    # torch._dynamo wraps torch.manual_seed in torch._disable_dynamo, so that dynamo never traces it: the same
    # function (functools.wraps: its __wrapped__), called through torch's own guard (its code in torch/_compile.py),
    # which does nothing outside a compiled region
    if (name, key) != ("torch", "manual_seed") or getattr(new, "__wrapped__", None) is not old:
        return False
    code, guard = getattr(new, "__code__", None), getattr(sys.modules.get("torch._compile"), "__file__", None)
    return code is not None and isinstance(guard, str) and code.co_name == "inner" and \
        os.path.realpath(code.co_filename) == os.path.realpath(guard)


def inert_environ():
    # torch._dynamo asks torch for its cache folder at import, which sets TORCHINDUCTOR_CACHE_DIR to the default
    # folder when the variable was not set: a value made from the run's own environment (the same as the zygote's,
    # TMPDIR and the user), set again in each run's environment (become) as its own import would have set it
    value = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    if value is None or "TORCHINDUCTOR_CACHE_DIR" in STARTED or utils is None:
        return {}
    try:
        default = os.path.abspath(utils.default_cache_dir())
    except Exception:
        return {}
    return {"TORCHINDUCTOR_CACHE_DIR": value} if value == default else {}


def inert_finder(finder):
    # transformers appends a finder of its own renamed modules (transformers.<old name> -> the new one). Last in
    # sys.meta_path, it is asked only for what no finder before it found, and answers only names under
    # transformers: a run imports those after transformers itself, which adds the finder in a fresh process too.
    kind = type(finder)
    if (kind.__module__, kind.__qualname__) != ("transformers.utils.import_utils", "_LegacyModuleAliasFinder"):
        return False
    machinery = sys.modules.get("importlib.machinery")
    path_finder = getattr(machinery, "PathFinder", None)
    return path_finder in sys.meta_path and sys.meta_path.index(path_finder) < sys.meta_path.index(finder)


def inert_reexecuted(name, old, module):
    # transformers.processing_utils executes transformers/__init__.py again (direct_transformers_import), which
    # puts a new lazy module of the same file in sys.modules, as it does in a fresh run that imports it; a run that
    # imports transformers alone gets that one, of the same import structure: its names are the same modules' own
    kind = type(module)
    return name == "transformers" and module is not old[0] and type(old[0]) is kind and \
        (kind.__module__, kind.__qualname__) == ("transformers.utils.import_utils", "_LazyModule") and \
        old[1].get("__file__") == getattr(module, "__file__", None)


def _private(key):
    # a module's private names (a cache, a backport patching a helper) are no API a probe relies on; dunders are
    return key.startswith("_") and not key.startswith("__")


def traces(before, settled):
    # What changed since `before` (bindings) and `settled` (settings): a rebound or new name in a module that was
    # loaded (a submodule bound into its package and a lazy module's cache aside), or a process-wide setting.
    for name, (was, old) in before.items():
        module = sys.modules.get(name)
        if module is None:
            return f"{name} was unloaded"
        if module is not was and not inert_reexecuted(name, (was, old), module):
            return f"it replaces the module {name}"
        now = vars(module)
        try:
            if now == old:
                continue
        except Exception:
            pass
        if module is not was:
            continue  # a new module of the same file and kind (inert_reexecuted): its own start, not a change
        lazy = "__getattr__" in old or type(module) is not types.ModuleType
        for key, value in now.items():
            if isinstance(value, types.ModuleType) or key == "__warningregistry__" or _private(key):
                continue
            if key in old and old[key] is not value and not inert_rebinding(name, key, old[key], value):
                return f"it rebinds {name}.{key}"
            if key not in old and not lazy:
                return f"it adds {name}.{key}"
    now = settings()
    for key in settled:  # a setting of a module loaded by this import is that module's own start
        if settled[key] != now.get(key):
            return f"it changes {key}"
    return None


def made(name):
    # A module an import made from no file, which no finder knows (torch.distributed.nn's
    # _remote_module_non_scriptable, compiled from generated source, its origin "torch-git"): its maker's own,
    # made again by the maker's import in a fresh process. Built-in and frozen modules have no file either.
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and getattr(module, "__file__", None) is None and \
        getattr(module, "__path__", None) is None and getattr(spec, "origin", None) not in ("built-in", "frozen")


def groups(names):
    # The names by top-level package, in the order of each package's first name.
    found = {}
    for name in names:
        found.setdefault(name.split(".")[0], []).append(name)
    return list(found.items())


def check(todo, out, recorded=(), barred=()):
    # Import the groups of `todo` in turn, each checked against what was there before it; stop at the first that
    # imports another package first (its "deps"), leaves a trace, starts a thread, loads a foreign module, or fails.
    # A package of a `recorded` list (learned clean, its packages that import each other learned together) is no
    # "deps": it is checked with the group that imports it, as a module a group's import `made` is. A group
    # importing a module of `barred` (refused for good before) is refused with it. `out(done, stop)` gets the names
    # imported clean, in order, and why it stopped (None: it did not).
    done = []
    before, settled = bindings(), settings()
    for top, names in todo:
        loaded = set(sys.modules)
        try:
            for name in names:
                if name.startswith("vllm.") or name == "vllm" or name.startswith("__"):
                    raise ImportError(f"{name} is never preloaded")
                try:
                    importlib.import_module(name)
                except ModuleNotFoundError as exc:
                    # a recorded module made by another module's import, which no finder knows (Cython's shared
                    # _cython_3_3_0, whose maker may be refused since): left out, as a run imports it anyway
                    if not (recorded and exc.name == name and "." not in name):
                        raise
        except BaseException as exc:
            return out(done, {"top": top, "names": names, "failed": f"{type(exc).__name__}: {exc}"})
        new = [m for m in sys.modules if m not in loaded]
        own = {top, *(n.split(".")[0] for n in names)}
        deps = [m for m in new if m.split(".")[0] not in own and m.split(".")[0] not in recorded
                and not m.startswith("__") and not made(m)]
        why = None
        refused = [m for m in new if m in barred]
        if refused:
            why = f"it imports {refused[0]}, refused before"
        elif threads() > 1:
            why = "its import started a thread"
        elif any(foreign(m, sys.modules[m]) for m in new if m in sys.modules):
            why = "its import loaded a module from outside the venv"
        elif deps:
            return out(done, {"top": top, "names": names, "deps": deps})
        else:
            why = traces(before, settled)
        if why is not None:
            return out(done, {"top": top, "names": names, "refused": why})
        done += [n for n in names if n in sys.modules]
        before.update(bindings({*new, *(m for m, (was, _) in before.items() if sys.modules.get(m) is not was)}))
        settled = settings()
    return out(done, None)


def apart(todo, barred):
    # `check` in a child of this zygote, so that whatever an import does stays there: its answer, or a failure.
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        libc.prctl(1, signal.SIGKILL)
        try:
            check(todo, lambda done, stop: os.write(write, DUMPS({"done": done, "stop": stop}).encode()), (), barred)
        finally:
            os._exit(0)
    os.close(write)
    data = b""
    while True:
        ready, _, _ = select.select([read, LIFE], [], [], 0.05)
        reap()  # the runs that end meanwhile (never the trial: it is waited for below)
        if read in ready:
            chunk = os.read(read, 1 << 20)
            if not chunk:
                break
            data += chunk
        elif LIFE in ready and not os.read(LIFE, 1 << 16):
            os.kill(pid, signal.SIGKILL)
            leave()
    os.close(read)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # reaped with the runs
    try:
        return LOADS(data)
    except ValueError:
        return {"done": [], "stop": {"top": todo[0][0], "names": todo[0][1], "failed": "the check ended"}}


def preload(names, tried_apart, tops=(), barred=()):
    # Import `names` for the runs to come. Learning (tried_apart): each package is first imported in a child, after
    # the packages it imports, and only what left no trace is imported here. A recorded list (not apart) was
    # checked when it was learned: it is checked again as it is imported, and any trace makes this zygote unsafe.
    answer = {"loaded": [], "refused": {}, "failed": []}
    names = [n for n in names if n not in sys.modules]
    todo, moved = groups(names), {}
    while todo:
        if tried_apart:
            result = apart(todo, barred)
            for name in result["done"]:
                importlib.import_module(name)  # what the child imported clean, in its order
        else:
            result = {}
            check(todo, lambda done, stop: result.update(done=done, stop=stop),
                  {*tops, *(n.split(".")[0] for _, group in todo for n in group)}, barred)
        answer["loaded"] += result["done"]
        stop = result["stop"]
        if threads() > 1:
            return {**answer, "unsafe": "an import started a thread"}
        if stop is None:
            break
        if not tried_apart:
            # the recorded packages import each other in any order (check's `recorded`); what a group imports
            # beyond the list was never learned (one refused before is check's `barred`: refused, traced)
            outside = sorted({m.split(".")[0] for m in stop.get("deps", ())})
            why = stop.get("refused") or stop.get("failed") or (
                f"it imports {', '.join(outside)}, which the list does not hold")
            return {**answer, "unsafe": f"{stop['top']}: {why}", "at": stop["names"],
                    "traced": bool(stop.get("refused"))}
        rest = [(top, group) for top, group in todo if top != stop["top"]]
        if "deps" in stop and moved.get(stop["top"], 0) < 3:
            # what it imports of other packages goes first, each with its own names; packages that import each
            # other (asyncio and _asyncio) go together, as one
            moved[stop["top"]] = moved.get(stop["top"], 0) + 1
            first = [(top, list(dict.fromkeys(group + [n for t, g in rest if t == top for n in g])))
                     for top, group in groups(stop["deps"])]
            ahead = {top for top, _ in first}
            if moved[stop["top"]] == 1:
                todo = first + [(stop["top"], stop["names"])]
            else:
                todo = [(stop["top"], [n for _, g in first for n in g] + stop["names"])]
            todo += [(t, g) for t, g in rest if t not in ahead]
            continue
        if "failed" in stop:
            answer["failed"] += stop["names"]
        else:
            why = stop.get("refused") or "it imports other packages whichever comes first"
            answer["refused"].update((name, why) for name in stop["names"])
        todo = rest
    answer["loaded"] = [n for n in answer["loaded"] if n in sys.modules]
    # a name refused with its group (mixed.clean, with the mixed.dirty that left a trace) and imported clean after,
    # with a package that imports it (moved into that package's group): preloaded, so refused no longer; recorded
    # refused, it would bar its importer from the list in the next command
    answer["refused"] = {n: why for n, why in answer["refused"].items() if n not in sys.modules}
    return answer


# -- the runs ----------------------------------------------------------------------------------------------------

CHILDREN = {}  # the runs' keepers -> the connection their status goes to


def reap():
    # pass on the status of each run that ended
    while CHILDREN:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        conn = CHILDREN.pop(pid, None)
        if conn is not None:
            try:
                conn.send(DUMPS({"status": status}).encode())
            except OSError:
                pass
            conn.close()


def peer(conn):
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def serve():
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(ADDRESS)
    listener.listen(64)
    say(f"ready {os.getpid()}")
    children = CHILDREN
    while True:
        reap()
        ready, _, _ = select.select([listener, LIFE], [], [], 0.05 if children else 1.0)
        if LIFE in ready and not os.read(LIFE, 1 << 16):
            for pid in children:
                try:
                    os.kill(pid, signal.SIGTERM)  # the keeper ends what its run started
                except OSError:
                    pass
            leave()
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        pid, uid = peer(conn)
        if uid != os.getuid() or pid != VPATCH:
            say(f"refused {pid} {uid}")  # nothing read from it, nothing run
            conn.close()
            continue
        try:
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 1)
            request = LOADS(data)
        except (OSError, ValueError):
            conn.close()
            continue
        if "preload" in request:
            conn.send(DUMPS(preload([str(n) for n in request["preload"]], bool(request.get("apart")),
                                    [str(t) for t in request.get("tops", ())],
                                    {str(n) for n in request.get("barred", ())})).encode())
            conn.close()
            continue
        if not fds:
            conn.close()
            continue
        if threads() > 1:
            conn.send(DUMPS({"refused": "the zygote runs more than one thread"}).encode())
            conn.close()
            os.close(fds[0])
            continue
        known = set(sys.modules)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            listener.close()
            for other in children.values():
                other.close()
            return request, fds[0], conn, known
        os.close(fds[0])
        conn.send(DUMPS({"pid": pid}).encode())
        children[pid] = conn


def keep(request, out, conn, known):
    # The keeper, as the runner's supervisor is for a fresh run: a session of its own, the subreaper of what the
    # run starts, ended (with all of it) by SIGTERM or by the zygote's end; the probe is its child, no group or
    # session leader, so that setsid works as in a fresh run. Its exit status is the probe's.
    os.setsid()
    libc.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    signal.signal(signal.SIGTERM, lambda *_: (end_all(), os._exit(128 + signal.SIGTERM)))
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: the zygote's end is ours
    if os.getppid() != ZYGOTE:
        os._exit(137)
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        become(request, out, conn, known)
        return
    os.close(out)
    conn.close()
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    end_all()
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


def reseed():
    # A fresh interpreter seeds random, numpy's global generator and torch's default generator from the OS when
    # they are imported: a child of the zygote, which imported them once, draws new seeds the same way.
    random.seed()
    for name, reseed in (("numpy.random", "seed"), ("torch", "seed")):
        module = sys.modules.get(name)
        if module is not None:
            try:
                getattr(module, reseed)()
            except Exception:
                pass


def become(request, out, conn, known):
    # Turn this child into `python script args` as started fresh.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.close(LIFE)
    os.close(REPORT)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    env = request["env"]
    os.chdir(request["cwd"])
    preloaded = inert_environ()  # what a preloaded import set, as the run's own import would have
    os.environ.clear()
    os.environ.update(env)
    os.environ.update({k: v for k, v in preloaded.items() if k not in env})
    argv = request["argv"][1:]
    module = argv[1] if argv[0] == "-m" else None
    if module is not None:
        argv = argv[1:]  # run_module makes argv[0] the module's file, as python -m does
    sys.argv[:] = argv
    script = argv[0]
    tree = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    # sys.path's first entry: the script's folder, or for -m the working folder, as python puts it there
    first = os.getcwd() if module is not None else os.path.dirname(os.path.abspath(script))
    path = []
    for entry in [*tree, *BASE]:  # site drops repeated entries; the first is put before them as it is
        if entry not in path:
            path.append(entry)
    sys.path[:] = [first, *path]
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    reseed()
    places = tuple(os.path.realpath(p) + os.sep for p in [*tree, first, os.getcwd()])

    def report():
        names = [name for name, module in list(sys.modules.items())
                 if name not in known and not foreign(name, module) and not name.startswith("__")
                 and not any(os.path.realpath(str(getattr(module, "__file__", None) or "")).startswith(p)
                             for p in places)]
        try:
            for start in range(0, len(names), 500):  # a message of a Unix socket is bounded (its send buffer)
                conn.send(DUMPS({"modules": names[start:start + 500]}).encode())
        except Exception:
            pass

    import atexit
    atexit.register(report)  # first registered, so it runs after the probe's own exit handlers
    try:
        if module is not None:
            try:
                script = getattr(importlib.util.find_spec(module), "origin", None) or script
            except Exception:
                pass  # run_module says what is wrong with it
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as exc:
        # the traceback a fresh `python script` prints: from the script's frame on, not this zygote's
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        tb = tb or exc.__traceback__
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        if isinstance(exc, KeyboardInterrupt):
            sys.stdout.flush()
            sys.stderr.flush()
            atexit._run_exitfuncs()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        raise SystemExit(1) from None


keep(*serve())
"""
