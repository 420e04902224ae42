"""The warm interpreter of a probe venv (probes/zygote.py is its vpatch side), run by that venv's python by path:
``python zygote_server.py <socket> <vpatch pid>``, with vpatch's end of a pipe as stdin.

It listens on a socket in a 0700 folder of vpatch's and serves only vpatch (SO_PEERCRED: our uid and vpatch's pid);
anything else is refused and named on its report stream: "refused <pid> <uid>". {"preload": [names], "apart": bool,
"tops": [the whole list's packages], "barred": [modules refused]} -> {"loaded", "refused": {name: why}, "failed",
"unsafe"}; {"argv", "cwd", "env"} with the run's output pipe -> {"pid"}, then the child's {"modules"} and the
zygote's {"status"}. A run that comes while it learns is forked between the trials (apart), as the zygote is then.
It ends, ending its runs, when the pipe it got as stdin (vpatch) closes: vpatch ended, even by SIGKILL. Its own
stdin and stdout are /dev/null and stderr: a module that reads stdin at import reads nothing, one that prints
cannot garble the report stream. Each run's keeper ends everything the run started (reaper.keep).
"""

from __future__ import annotations

import atexit
import gc  # loaded before any import is checked, so that its settings count from the start
import importlib
import importlib.util
import json
import os
import random
import runpy
import select
import signal
import socket
import struct
import sys
import types
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from vpatch.probes.child import reaper
else:
    import reaper  # run by path: this folder is sys.path's first entry
    # a probe's own module of that name is its own, not ours
    sys.modules.pop("reaper", None)

# A request, a reply, a preload's answer: JSON objects.
Message = dict[str, Any]
# A watched module's bindings: the module object and a copy of its namespace.
Bindings = dict[str, tuple[types.ModuleType, dict[str, Any]]]

ROOTS = tuple(sorted({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                             sys.base_exec_prefix)}))
VENV = os.path.realpath(sys.prefix) + os.sep
DUMPS, LOADS = json.dumps, json.loads  # a probe may replace json's functions in its child, never ours
# Set by main: where it listens, whom it serves, its own pid, the environment it was started with (the runs' own,
# PYTHONPATH aside), sys.path without that PYTHONPATH, and its two pipes to vpatch.
ADDRESS = ""
VPATCH = 0
ZYGOTE = 0
STARTED: dict[str, str] = {}
BASE: list[str] = []
LIFE = -1  # vpatch's end of this pipe closes when vpatch ends
REPORT = -1
MAIN: types.ModuleType | None = None  # this module, as __main__
OWN: set[str] = set()  # the modules this server imported for itself (set by main): none of them is preloaded


def leave() -> NoReturn:
    # vpatch ended (maybe killed): end here, and take the socket and its folder along
    for remove in (os.unlink, os.rmdir):
        try:
            remove(ADDRESS if remove is os.unlink else os.path.dirname(ADDRESS))
        except OSError:
            pass
    os._exit(0)


def say(line: str) -> None:
    os.write(REPORT, (line + "\n").encode())


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def inside(module: types.ModuleType) -> bool:
    # Whether a module comes from the venv or the interpreter's library (or from no file at all).
    paths = [module.__file__] if getattr(module, "__file__", None) else list(getattr(module, "__path__", None) or [])
    return all(os.path.realpath(p).startswith(ROOTS) for p in paths if isinstance(p, str))


def foreign(name: str, module: types.ModuleType) -> bool:
    if module is MAIN:
        # this server, run by path: multiprocessing's import makes it `__mp_main__` too, as it makes a fresh run's
        # own script, and that is no module of elsewhere that an import loaded
        return False
    return name == "vllm" or name.startswith("vllm.") or not inside(module)


# -- the leak check: what an import may not change in what was there before it ------------------------------------

# Process-wide settings a module holds outside its own bindings, read when that module is loaded.
SETTINGS: dict[str, tuple[str, ...]] = {
    "torch": ("get_default_dtype", "is_grad_enabled", "are_deterministic_algorithms_enabled", "get_num_threads",
              "get_default_device", "initial_seed"),  # a seed set at import is one a probe could rely on
    "numpy": ("geterr", "get_printoptions"),
    "socket": ("getdefaulttimeout",),
    "sys": ("getrecursionlimit", "getswitchinterval", "gettrace", "getprofile", "get_int_max_str_digits"),
    "gc": ("isenabled", "get_threshold"),
}


def settings() -> dict[str, Any]:
    inert = inert_environ()
    seen: dict[str, Any] = {"cwd": os.getcwd(), "environ": {k: v for k, v in os.environ.items() if k not in inert},
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
            except Exception:  # noqa: BLE001 - a getter that fails is a setting not compared
                pass
    return seen



def watched(name: str, module: types.ModuleType) -> bool:
    # Whose bindings an import may not change: builtins and the venv's packages. The interpreter's own library is
    # not watched: torch rebinds inspect.getfile, typing_extensions typing's helpers, and a probe imports them.
    if name == "builtins":
        return True
    where = getattr(module, "__file__", None)
    return isinstance(where, str) and os.path.realpath(where).startswith(VENV) and isinstance(
        getattr(module, "__dict__", None), dict)


def bindings(names: Iterable[str] | None = None) -> Bindings:
    # each watched module's bindings, and the module itself (one executed again is a new object in sys.modules)
    return {name: (module, dict(vars(module))) for name, module in list(sys.modules.items())
            if (names is None or name in names) and watched(name, module)}


# Traces two packages leave on every import, each matched exactly, and inert for a run that does not import the
# package (a run that does gets the same in a fresh process): without them the zygote would import torch._dynamo
# (with torch._inductor) and transformers in every run, about 1.6 s of each probe run of vLLM, whose every
# import of vllm imports both.
def inert_rebinding(name: str, key: str, old: object, new: object) -> bool:
    # torch._dynamo wraps torch.manual_seed in torch._disable_dynamo, so that dynamo never traces it: the same
    # function (functools.wraps: its __wrapped__), called through torch's own guard (its code in torch/_compile.py),
    # which does nothing outside a compiled region
    if (name, key) != ("torch", "manual_seed") or getattr(new, "__wrapped__", None) is not old:
        return False
    code, guard = getattr(new, "__code__", None), getattr(sys.modules.get("torch._compile"), "__file__", None)
    return code is not None and isinstance(guard, str) and code.co_name == "inner" and \
        os.path.realpath(code.co_filename) == os.path.realpath(guard)


def inert_environ() -> dict[str, str]:
    # torch._dynamo asks torch for its cache folder at import, which sets TORCHINDUCTOR_CACHE_DIR to the default
    # folder when the variable was not set: a value made from the run's own environment (the same as the zygote's,
    # TMPDIR and the user), set again in each run's environment (become) as its own import would have set it
    value = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    if value is None or "TORCHINDUCTOR_CACHE_DIR" in STARTED or utils is None:
        return {}
    try:
        default = os.path.abspath(utils.default_cache_dir())
    except Exception:  # noqa: BLE001 - torch's own helper failed: the value is not known inert
        return {}
    return {"TORCHINDUCTOR_CACHE_DIR": value} if value == default else {}


def inert_finder(finder: object) -> bool:
    # transformers appends a finder of its own renamed modules (transformers.<old name> -> the new one). Last in
    # sys.meta_path, it is asked only for what no finder before it found, and answers only names under
    # transformers: a run imports those after transformers itself, which adds the finder in a fresh process too.
    kind = type(finder)
    if (kind.__module__, kind.__qualname__) != ("transformers.utils.import_utils", "_LegacyModuleAliasFinder"):
        return False
    machinery = sys.modules.get("importlib.machinery")
    path_finder = getattr(machinery, "PathFinder", None)
    finders: list[object] = list(sys.meta_path)
    return path_finder in finders and finders.index(path_finder) < finders.index(finder)


def inert_reexecuted(name: str, old: tuple[types.ModuleType, dict[str, Any]], module: types.ModuleType) -> bool:
    # transformers.processing_utils executes transformers/__init__.py again (direct_transformers_import), which
    # puts a new lazy module of the same file in sys.modules, as it does in a fresh run that imports it; a run that
    # imports transformers alone gets that one, of the same import structure: its names are the same modules' own
    kind = type(module)
    return name == "transformers" and module is not old[0] and type(old[0]) is kind and \
        (kind.__module__, kind.__qualname__) == ("transformers.utils.import_utils", "_LazyModule") and \
        old[1].get("__file__") == getattr(module, "__file__", None)


def private(key: str) -> bool:
    # a module's private names (a cache, a backport patching a helper) are no API a probe relies on; dunders are
    return key.startswith("_") and not key.startswith("__")


def traces(before: Bindings, settled: dict[str, Any]) -> str | None:
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
        except Exception:  # noqa: BLE001 - a value whose == raises is compared name by name below
            pass
        if module is not was:
            continue  # a new module of the same file and kind (inert_reexecuted): its own start, not a change
        lazy = "__getattr__" in old or type(module) is not types.ModuleType
        for key, value in now.items():
            if isinstance(value, types.ModuleType) or key == "__warningregistry__" or private(key):
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


def made(name: str) -> bool:
    # A module an import made from no file, which no finder knows (torch.distributed.nn's
    # _remote_module_non_scriptable, compiled from generated source, its origin "torch-git"): its maker's own,
    # made again by the maker's import in a fresh process. Built-in and frozen modules have no file either.
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and getattr(module, "__file__", None) is None and \
        getattr(module, "__path__", None) is None and getattr(spec, "origin", None) not in ("built-in", "frozen")


def groups(names: Iterable[str]) -> list[tuple[str, list[str]]]:
    # The names by top-level package, in the order of each package's first name.
    found: dict[str, list[str]] = {}
    for name in names:
        found.setdefault(name.split(".")[0], []).append(name)
    return list(found.items())


def check(todo: list[tuple[str, list[str]]], out: Callable[[list[str], Message | None], None],
          recorded: Iterable[str] = (), barred: Iterable[str] = (), *, together: Iterable[str] | None = None) -> None:
    # Import the groups of `todo` in turn, each checked against what was there before it; stop at the first that
    # imports another package first (its "deps"), leaves a trace, starts a thread, loads a foreign module, or fails.
    # A package of a `recorded` list (learned clean, its packages that import each other learned together) is no
    # "deps": it is checked with the group that imports it, as a module a group's import `made` is. `together`
    # (learning: the names to learn): a group is checked with the packages it imports, and stops at its "deps" only
    # where it left a trace, so that the trace is put where it belongs (each of them first, apart); a clean import
    # is one round, not one per package it imports in an order the runs' report does not show, and what it imported
    # of `together` is imported clean with it. A group importing a module of `barred` (refused for good before) is
    # refused with it. `out(done, stop)` gets the names imported clean, in order, and why it stopped (None: it did
    # not).
    done: list[str] = []
    wanted = set(together or ())
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
        except BaseException as exc:  # noqa: BLE001 - whatever an import raises, it is not preloaded
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
        elif deps and together is None:
            return out(done, {"top": top, "names": names, "deps": deps})
        else:
            why = traces(before, settled)
            if why is not None and deps:
                return out(done, {"top": top, "names": names, "deps": deps})
        if why is not None:
            return out(done, {"top": top, "names": names, "refused": why})
        ours = [n for n in names if n in sys.modules]
        done += ours
        if together is not None:  # what it imported of the other names to learn is imported clean too, with it
            mine = set(ours)
            done += [m for m in new if m in wanted and m not in mine]
        before.update(bindings({*new, *(m for m, (was, _) in before.items() if sys.modules.get(m) is not was)}))
        settled = settings()
        # what is in by now stays for the zygote's life: its collections during the next imports pass over it (a
        # quarter of a list's import time was collections of the modules imported before)
        gc.freeze()
    return out(done, None)


def apart(todo: list[tuple[str, list[str]]], barred: Iterable[str], learning: list[str]) -> Message:
    # `check` in a child of this zygote, so that whatever an import does stays there: its answer, or a failure.
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        reaper.prctl(reaper.PR_SET_PDEATHSIG, signal.SIGKILL)
        try:
            def send(done: list[str], stop: Message | None) -> None:
                os.write(write, DUMPS({"done": done, "stop": stop}).encode())

            check(todo, send, (), barred, together=learning)
        finally:
            os._exit(0)
    os.close(write)
    data = b""
    # While the trial imports, this zygote waits: a run that comes meanwhile is forked as it is now, with what it
    # preloaded before this trial (vpatch sends runs here only once it is warm; see Zygote.run).
    listener = [LISTENER.fileno()] if LISTENER is not None else []
    while True:
        ready, _, _ = select.select([read, LIFE, *listener], [], [], 0.05)
        reap()  # the runs that end meanwhile (never the trial: it is waited for below)
        if listener and listener[0] in ready and LISTENER is not None:
            try:
                take(LISTENER, learning=True)
            except Forked:
                os.close(read)  # the trial's answer is this zygote's
                raise
            continue
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
        answer: Message = LOADS(data)
        return answer
    except ValueError:
        return {"done": [], "stop": {"top": todo[0][0], "names": todo[0][1], "failed": "the check ended"}}


def preload(names: list[str], tried_apart: bool, tops: Iterable[str] = (), barred: Iterable[str] = ()) -> Message:
    # Import `names` for the runs to come. Learning (tried_apart): each package is first imported in a child, with
    # the packages it imports (those first, each alone, where it left a trace), and only what left no trace is
    # imported here. A recorded list (not apart) was
    # checked when it was learned: it is checked again as it is imported, and any trace makes this zygote unsafe.
    # a name an earlier preload imported with the package that imports it (another batch's, learned together) is
    # loaded: the list keeps it
    names = list(dict.fromkeys(names))
    answer: Message = {"loaded": [n for n in names if n in sys.modules and n not in OWN], "refused": {}, "failed": []}
    names = [n for n in names if n not in sys.modules]
    todo = groups(names)
    moved: dict[str, int] = {}
    while todo:
        result: Message = {}
        if tried_apart:
            result = apart(todo, barred, names)
            for name in result["done"]:
                importlib.import_module(name)  # what the child imported clean, in its order
        else:

            def keep_answer(done: list[str], stop: Message | None, result: Message = result) -> None:
                result.update(done=done, stop=stop)

            check(todo, keep_answer,
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
                todo = [*first, (stop["top"], stop["names"])]
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

CHILDREN: dict[int, socket.socket] = {}  # the runs' keepers -> the connection their status goes to


def reap() -> None:
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


def peer(conn: socket.socket) -> tuple[int, int]:
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


class Forked(BaseException):  # not an error: how a run's child leaves the zygote's loops for keep()
    # Raised in a run's child, wherever its zygote forked it (its loop, or between the trials of its learning), and
    # caught by serve, which returns the run to main: what the zygote was doing is the zygote's, not the run's.
    def __init__(self, run: tuple[Message, int, socket.socket, set[str]]) -> None:
        super().__init__()
        self.run = run


LISTENER: socket.socket | None = None  # where vpatch's requests come (set by serve)


def take(listener: socket.socket, *, learning: bool = False) -> None:
    # One connection: a preload (answered when it is done) or a run (forked now; in the child, Forked). `learning`:
    # between the trials of a preload, where only runs are taken (vpatch asks for one preload at a time).
    conn, _ = listener.accept()
    pid, uid = peer(conn)
    if uid != os.getuid() or pid != VPATCH:
        say(f"refused {pid} {uid}")  # nothing read from it, nothing run
        conn.close()
        return
    try:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 1)
        request = LOADS(data)
    except (OSError, ValueError):
        conn.close()
        return
    if "preload" in request:
        if learning:
            conn.send(DUMPS({"loaded": [], "refused": {}, "failed": [], "unsafe": "a preload asked for during one",
                             "traced": False}).encode())
        else:
            try:
                answer = preload([str(n) for n in request["preload"]], bool(request.get("apart")),
                                 [str(t) for t in request.get("tops", ())], {str(n) for n in request.get("barred", ())})
            except Forked:
                conn.close()  # in a run forked while it learned: the answer is the zygote's to give
                raise
            conn.send(DUMPS(answer).encode())
        conn.close()
        return
    if not fds:
        conn.close()
        return
    if threads() > 1:
        conn.send(DUMPS({"refused": "the zygote runs more than one thread"}).encode())
        conn.close()
        os.close(fds[0])
        return
    known = set(sys.modules)
    sys.stdout.flush()
    sys.stderr.flush()
    # What is alive now is the run's to share, never to collect: the run's collections pass over it, instead of
    # touching (and so copying) every page of the preloaded heap; what the run makes is collected as in a fresh python
    gc.freeze()
    pid = os.fork()
    if pid == 0:
        listener.close()
        for other in CHILDREN.values():
            other.close()
        raise Forked((request, fds[0], conn, known))
    os.close(fds[0])
    conn.send(DUMPS({"pid": pid}).encode())
    CHILDREN[pid] = conn


def serve() -> tuple[Message, int, socket.socket, set[str]]:
    global LISTENER
    listener = LISTENER = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(ADDRESS)
    listener.listen(64)
    say(f"ready {os.getpid()}")
    children = CHILDREN
    while True:
        reap()
        ready, _, _ = select.select([listener.fileno(), LIFE], [], [], 0.05 if children else 1.0)
        if LIFE in ready and not os.read(LIFE, 1 << 16):
            for pid in children:
                try:
                    os.kill(pid, signal.SIGTERM)  # the keeper ends what its run started
                except OSError:
                    pass
            leave()
        if listener.fileno() not in ready:
            continue
        try:
            take(listener)
        except Forked as forked:
            return forked.run


def keep(request: Message, out: int, conn: socket.socket, known: set[str]) -> None:
    # The keeper, as the runner's supervisor is for a fresh run: a session of its own, the subreaper of what the
    # run starts, ended (with all of it) by SIGTERM or by the zygote's end; the probe is its child, no group or
    # session leader, so that setsid works as in a fresh run. Its exit status is the probe's.
    os.setsid()

    def release() -> None:  # the run's output and status are the run's: the keeper holds no copy
        os.close(out)
        conn.close()

    reaper.keep(ZYGOTE, release)
    become(request, out, conn, known)


def reseed() -> None:
    # A fresh interpreter seeds random, numpy's global generator and torch's default generator from the OS when
    # they are imported: a child of the zygote, which imported them once, draws new seeds the same way.
    random.seed()
    for name, reseed in (("numpy.random", "seed"), ("torch", "seed")):
        module = sys.modules.get(name)
        if module is not None:
            try:
                getattr(module, reseed)()
            except Exception:  # noqa: BLE001 - a generator that cannot be seeded stays as it is
                pass


def become(request: Message, out: int, conn: socket.socket, known: set[str]) -> None:
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

    def report() -> None:
        names = [name for name, module in list(sys.modules.items())
                 if name not in known and not foreign(name, module) and not name.startswith("__")
                 and not any(os.path.realpath(str(getattr(module, "__file__", None) or "")).startswith(p)
                             for p in places)]
        try:
            for start in range(0, len(names), 500):  # a message of a Unix socket is bounded (its send buffer)
                conn.send(DUMPS({"modules": names[start:start + 500]}).encode())
        except Exception:  # noqa: BLE001 - at exit, what a run imported is a hint, never its result
            pass

    ending: dict[str, int] = {"status": 0, "signal": 0}

    def end() -> None:
        # First registered, so the last exit handler: after the run's own handlers and its non-daemon threads, as in a
        # fresh python. What it imported goes to the zygote, the standard streams are flushed, and the process ends
        # with the run's status without the interpreter's teardown of every module: in a child of the zygote that
        # teardown touches (and so copies) the whole inherited heap, 1-2.5 s a run where the probe itself took 1.3 s.
        # What it skips is the finalization of objects still alive at the end (a fresh python's teardown would run
        # their __del__ and flush a file left open): what a run says is its status and its output, both whole here.
        report()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a stream the run closed or replaced has nothing left to say
                pass
        if ending["signal"]:
            signal.signal(ending["signal"], signal.SIG_DFL)
            os.kill(os.getpid(), ending["signal"])
        os._exit(ending["status"])

    atexit.register(end)
    try:
        run_as_main(module, script, ending)
    except SystemExit as exc:
        ending["status"] = exit_status(exc.code)
        raise


def exit_status(code: object) -> int:
    # The status a python ends with on SystemExit(code): None 0, an int itself (as C's exit takes it), else 1 (its
    # message is printed by the interpreter, as the exception goes on)
    if code is None:
        return 0
    if isinstance(code, int):
        return code if -(2 ** 31) <= code < 2 ** 31 else -1
    return 1


def run_as_main(module: str | None, script: str, ending: dict[str, int]) -> None:
    try:
        if module is not None:
            try:
                script = getattr(importlib.util.find_spec(module), "origin", None) or script
            except Exception:  # noqa: BLE001 - run_module says what is wrong with it
                pass  # run_module says what is wrong with it
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - anything the probe raised ends it as a fresh python would
        # the traceback a fresh `python script` prints: from the script's frame on, not this zygote's
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        tb = tb or exc.__traceback__
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        if isinstance(exc, KeyboardInterrupt):  # a fresh python dies of the signal, after its exit handlers
            ending["signal"] = signal.SIGINT
            atexit._run_exitfuncs()
        raise SystemExit(1) from None



def main(argv: list[str]) -> None:
    global ADDRESS, VPATCH, ZYGOTE, STARTED, BASE, LIFE, REPORT, MAIN, OWN
    ADDRESS, VPATCH = argv[1], int(argv[2])
    MAIN = sys.modules["__main__"]
    OWN = set(sys.modules)
    sys.path[:] = sys.path[1:]  # this folder: a run's sys.path is made as a fresh python makes it
    ambient = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    BASE = [p for p in sys.path if p not in ambient]
    ZYGOTE = os.getpid()
    STARTED = dict(os.environ)
    LIFE = os.dup(0)
    REPORT = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    sys.stdin = open(0, closefd=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C ends vpatch, and so this zygote; a child restores it
    keep(*serve())


if __name__ == "__main__":
    main(sys.argv)
