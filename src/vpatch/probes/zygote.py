"""A warm interpreter per probe venv (the zygote): one process imports what the probes of that venv import, once,
and forks a child per probe run, so a run no longer pays ~5-10 s of third-party imports (torch, transformers).

The child runs the probe as a fresh ``python probe.py`` would: its argv, ``__main__``, cwd, environment (the
variables the run was started with, PYTHONPATH to the tree), stdout and stderr merged into one pipe, its exit
code or signal, its own process group (a timeout kills the group), stdin /dev/null. It never inherits anything of
``vllm`` or of a tree: the zygote's sys.path holds no tree, and it preloads only modules whose files lie in the
venv or the interpreter's own library; any other module makes it refuse to go on.

What to preload is measured, not listed: each child reports the modules it imported (in order) from those places,
the zygote imports them before its next fork, and the list is kept beside the venv (``vpatch-preload.json``) for
the next command. Threads do not survive fork: the zygote starts with OPENBLAS/OMP/MKL thread counts of 1, checks
before every fork that it runs one thread, and a module whose import starts one is recorded as refused (never
preloaded again) and ends that zygote.

Anything else falls back to a fresh process: a command that is not ``{python} script.py ...``, a probe that says
``fresh_process: true``, a run whose environment differs from the zygote's in more than PYTHONPATH (a module
preloaded under other variables would not see them), and a zygote that cannot start, refuses, or dies (the run
it was doing is run again, fresh; the session says so once).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vpatch.base import process
from vpatch.base.errors import ProcessError
from vpatch.base.fs import atomic_write
from vpatch.base.progress import Event, Reporter, silent

PRELOAD_FILE = "vpatch-preload.json"
# Set in the zygote (not in what a probe sees): a BLAS or OpenMP pool started at import would not survive fork.
THREAD_VARS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_SUBJECT = "probe zygote"
WEDGED_S = 600.0  # a zygote that takes longer to import, or to answer a run, is wedged: the runs go fresh


@dataclass(frozen=True)
class ZygoteRan:
    """A run in a child of the zygote: its exit code (negative: the signal), its merged output."""

    returncode: int
    output: bytes
    timed_out: bool = False
    cancelled: bool = False


class Zygote:
    """One warm interpreter of one probe venv, for the length of a session; `run` is safe from many threads."""

    def __init__(self, python: Path, *, env: Mapping[str, str], report: Reporter = silent) -> None:
        self.python = python
        self.env = dict(env)  # what a run must be started with (PYTHONPATH aside) to run here
        self.report = report
        self.address = f"vpatch-zygote-{os.getpid()}-{id(self):x}-{time.monotonic_ns()}"
        self.broken: str | None = None  # why it no longer takes runs
        self.runs = 0  # runs it ran to the end (a test reads that the runs went through it)
        self._file = python.parent.parent / PRELOAD_FILE
        self._lock = threading.Lock()  # held while the zygote imports: runs wait for it
        self._closed = False
        self._guard = threading.Lock()  # the modules runs reported, not yet preloaded
        self._pending: list[str] = []
        self._learning = False
        started = {**self.env, **{k: v for k, v in THREAD_VARS.items() if k not in self.env}}
        try:
            # cwd: a folder with no probe code in it (sys.path's first entry is dropped anyway)
            self._child = process.Child([str(python), "-c", _SERVER, self.address], cwd=python.parent.parent,
                                        env=started, shown=[str(python), "<probe zygote>"])
            ready = self._child.stdout.readline()
        except (ProcessError, OSError) as exc:
            self.broken = f"it did not start: {exc}"
            return
        if not ready.startswith(b"ready"):
            self.broken = f"it did not start: {self._child.failed('no ready line').message}"
            return
        self.pid = int(ready.split()[1])
        recorded = self._recorded()
        self._preloaded: set[str] = set()
        self._refused: set[str] = set(recorded.get("refused", []))
        self._known: list[str] = list(recorded.get("preload", []))
        if self._known:
            self._preload(self._known)

    # -- the vpatch side of one run ---------------------------------------------------------------------------

    def fits(self, argv: Sequence[str], env: Mapping[str, str]) -> bool:
        """Whether a run of `argv` with `env` (the whole environment) may run here."""
        if self.broken is not None or len(argv) < 2 or argv[0] != str(self.python):
            return False
        if argv[1].startswith("-") or not argv[1].endswith(".py"):
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
            conn.connect("\0" + self.address)
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
        reply = _message(conn, wait=WEDGED_S)
        early: list[str] = []
        while reply is not None and "modules" in reply:  # a child quicker than its zygote's reply
            early += [str(m) for m in reply["modules"]]
            reply = _message(conn, wait=WEDGED_S)
        if reply is None or "pid" not in reply:
            self._break(str(reply.get("refused", "it refused the run")) if reply else "it ended")
            return None
        pid = int(str(reply["pid"]))
        deadline = None if timeout is None else time.monotonic() + timeout
        chunks: list[bytes] = []
        timed_out = cancelled = False
        while True:
            wait = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
            ready, _, _ = select.select([read], [], [], wait)
            if ready:
                data = os.read(read, 1 << 16)
                if not data:
                    break
                chunks.append(data)
                continue
            if not timed_out and not cancelled:
                if deadline is not None and time.monotonic() >= deadline:
                    timed_out = True
                elif cancel is not None and cancel.is_set():
                    cancelled = True
                if timed_out or cancelled:
                    _kill_group(pid)
        _kill_group(pid)  # the child may be gone while what it started lives on in its group
        status = None
        learned = early
        while True:
            message = _message(conn)
            if message is None:
                break
            if "modules" in message:
                learned += [str(m) for m in message["modules"]]
            if "status" in message:
                status = int(str(message["status"]))
                break
        if learned:
            self._learn_later(learned)
        if status is None:
            if timed_out or cancelled:
                return ZygoteRan(124, b"".join(chunks), timed_out=timed_out, cancelled=cancelled)
            self._break("it ended during a run")
            return None
        self.runs += 1
        return ZygoteRan(os.waitstatus_to_exitcode(status), b"".join(chunks), timed_out=timed_out,
                         cancelled=cancelled)

    # -- what to preload ----------------------------------------------------------------------------------------

    def _recorded(self) -> dict[str, list[str]]:
        try:
            data = json.loads(self._file.read_bytes())
        except (OSError, ValueError):
            return {}
        return {key: [str(n) for n in data.get(key, [])] for key in ("preload", "refused")} \
            if isinstance(data, dict) else {}

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
                new = [m for m in dict.fromkeys(batch) if m not in self._preloaded and m not in self._refused]
                if new and self.broken is None and not self._closed:
                    known = set(self._known)
                    self._known += [m for m in new if m not in known]
                    self._preload(new)
        finally:
            self._lock.release()

    def _preload(self, names: list[str]) -> None:
        """Ask the zygote to import `names` (before its next fork) and record what it said (under self._lock, or
        before any run)."""
        started = time.monotonic()
        self.report(Event(_SUBJECT, "importing", f"{len(names)} modules the probes import"))
        answer: dict[str, Any] = {"loaded": [], "refused": []}
        for first in range(0, len(names), 500):  # a message of a Unix socket is bounded (its send buffer)
            try:
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                conn.connect("\0" + self.address)
                conn.send(json.dumps({"preload": names[first:first + 500]}).encode())
                part = _message(conn, wait=WEDGED_S)
                conn.close()
            except OSError as exc:
                part, reason = None, str(exc)
            else:
                reason = "it ended, or took too long, while importing"
            if part is None:
                self._break(reason)
                return
            answer["loaded"] += part.get("loaded", [])
            answer["refused"] += part.get("refused", [])
            if part.get("threads") or part.get("foreign"):
                answer.update({k: part[k] for k in ("threads", "foreign") if part.get(k)})
                break
        self._preloaded.update(answer.get("loaded", []))
        self._refused.update(answer.get("refused", []))
        if answer.get("threads"):  # that module started a thread: never again, and this zygote cannot fork
            self._refused.add(str(answer["threads"]))
            self._save()
            self._break(f"importing {answer['threads']} started a thread")
            return
        if answer.get("foreign"):
            self._refused.add(str(answer["foreign"]))
            self._save()
            self._break(f"importing {answer['foreign']} loaded a module from outside the venv")
            return
        self._save()
        self.report(Event(_SUBJECT, "warm", f"{len(self._preloaded)} modules preloaded", final=True,
                          seconds=time.monotonic() - started))

    def _save(self) -> None:
        data = {"preload": [m for m in self._known if m not in self._refused], "refused": sorted(self._refused)}
        try:
            atomic_write(self._file, json.dumps(data, indent=0).encode() + b"\n")
        except OSError:
            pass  # a read-only venv: the next command measures again

    def _break(self, why: str) -> None:
        if self.broken is None and not self._closed:
            self.broken = why
            self.report(Event(_SUBJECT, "fresh processes from now on", why, final=True))

    def close(self) -> None:
        """The zygote sees the end of its input, kills what it still runs and exits."""
        self._closed = True
        child = getattr(self, "_child", None)
        if child is not None:
            child.close()


def _message(conn: socket.socket, wait: float | None = None) -> dict[str, Any] | None:
    """The next message on `conn` (None: it closed)."""
    conn.settimeout(wait)
    try:
        data = conn.recv(1 << 20)
    except OSError:
        return None
    if not data:
        return None
    value = json.loads(data)
    return value if isinstance(value, dict) else None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# The zygote, run by the probe venv's python with `-c` (so no folder of vpatch's is on its sys.path). It speaks on
# an abstract Unix socket: {"preload": [names]} -> {"loaded", "refused", "threads", "foreign"}; {"argv", "cwd",
# "env"} with the run's output pipe -> {"pid"}, then the child's {"modules"} and the zygote's {"status"}. It ends,
# killing its children's groups, when its stdin (vpatch) closes: vpatch ended, even by SIGKILL.
_SERVER = r'''
import ctypes, importlib, json, os, runpy, select, signal, socket, sys, traceback

ADDRESS = sys.argv[1]
sys.path[:] = [p for p in sys.path[1:]]
AMBIENT = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
BASE = [p for p in sys.path if p not in AMBIENT]
ROOTS = tuple(sorted({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                             sys.base_exec_prefix)}))
ZYGOTE = os.getpid()
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C ends vpatch, and so this zygote; a child restores it


def threads():
    return len(os.listdir("/proc/self/task"))


def inside(module):
    """Whether a module comes from the venv or the interpreter's library (or from no file at all)."""
    paths = [module.__file__] if getattr(module, "__file__", None) else list(getattr(module, "__path__", None) or [])
    return all(os.path.realpath(p).startswith(ROOTS) for p in paths if isinstance(p, str))


def foreign(name, module):
    return name == "vllm" or name.startswith("vllm.") or not inside(module)


def preload(names):
    loaded, refused = [], []
    for name in names:
        if name in sys.modules:
            loaded.append(name)
            continue
        if name == "vllm" or name.startswith("vllm.") or name.startswith("__"):
            refused.append(name)
            continue
        before = set(sys.modules)
        try:
            importlib.import_module(name)
        except BaseException:
            refused.append(name)
            continue
        if threads() > 1:
            return {"loaded": loaded, "refused": refused, "threads": name}
        if any(foreign(m, sys.modules[m]) for m in set(sys.modules) - before if m in sys.modules):
            return {"loaded": loaded, "refused": refused, "foreign": name}
        loaded.append(name)
    return {"loaded": loaded, "refused": refused}


def kill_all(children):
    for pid in children:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def serve():
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind("\0" + ADDRESS)
    listener.listen(64)
    sys.stdout.write(f"ready {os.getpid()}\n")
    sys.stdout.flush()
    children = {}
    while True:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                try:
                    conn.send(json.dumps({"status": status}).encode())
                except OSError:
                    pass
                conn.close()
        ready, _, _ = select.select([listener, sys.stdin], [], [], 0.05 if children else 1.0)
        if sys.stdin in ready and not os.read(0, 1 << 16):
            kill_all(children)
            os._exit(0)
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        try:
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 1)
            request = json.loads(data)
        except (OSError, ValueError):
            conn.close()
            continue
        if "preload" in request:
            conn.send(json.dumps(preload(request["preload"])).encode())
            conn.close()
            continue
        if not fds:
            conn.close()
            continue
        if threads() > 1:
            conn.send(json.dumps({"refused": "the zygote runs more than one thread"}).encode())
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
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass  # the child did it first
        os.close(fds[0])
        conn.send(json.dumps({"pid": pid}).encode())
        children[pid] = conn


def become(request, out, conn, known):
    """Turn this child into `python script args` as started fresh."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the zygote's end is ours
    if os.getppid() != ZYGOTE:
        os._exit(137)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    env = request["env"]
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    argv = request["argv"][1:]
    sys.argv[:] = argv
    script = argv[0]
    tree = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    first = os.path.dirname(os.path.abspath(script))
    path = []
    for entry in [first, *tree, *BASE]:
        if entry not in path:
            path.append(entry)
    sys.path[:] = path
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    places = tuple(os.path.realpath(p) + os.sep for p in [*tree, first, os.getcwd()])

    def report():
        names = [name for name, module in list(sys.modules.items())
                 if name not in known and not foreign(name, module) and not name.startswith("__")
                 and not any(os.path.realpath(str(getattr(module, "__file__", None) or "")).startswith(p)
                             for p in places)]
        try:
            for start in range(0, len(names), 500):  # a message of a Unix socket is bounded (its send buffer)
                conn.send(json.dumps({"modules": names[start:start + 500]}).encode())
        except OSError:
            pass

    import atexit
    atexit.register(report)  # first registered, so it runs after the probe's own exit handlers
    try:
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


become(*serve())
'''
