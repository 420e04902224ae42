"""Faults and bad inputs of the warm interpreter (probes/zygote.py), each case also run the way a fresh process runs
it: a client that is not vpatch, modules whose import leaves a trace, generators, sessions, a stopped zygote,
a module that reads stdin, daemons, malformed preload lists, a probe that replaces json.dumps.

Real parts: a real venv made with `python -m venv` in tmp_path, its "third-party" modules written into its
site-packages (a `torch` of a few lines stands for the real one where only its default-dtype API matters), real
forks, sessions, sockets and another uid (setpriv)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ToyUpstream
from helpers.pids import gone

from vpatch.base import process
from vpatch.base.progress import Event
from vpatch.probes import workspace as probe_runs
from vpatch.probes import zygote as zygote_module
from vpatch.probes.zygote import PRELOAD_FILE, Zygote

MODULES = {
    # torch's default-dtype API, its state held outside the module's bindings (as torch holds it, in C)
    "torch/__init__.py": "_STATE = {'dtype': 'float32'}\n"
                         "def get_default_dtype():\n    return _STATE['dtype']\n"
                         "def set_default_dtype(dtype):\n    _STATE['dtype'] = dtype\n"
                         "def seed():\n    pass\n"
                         "def manual_seed(seed):\n    return seed\n",
    "evil_dtype.py": "import torch\ntorch.set_default_dtype('float64')\n",
    "evil_builtin.py": "import builtins\nbuiltins.LEAKED = 'evil_builtin'\n",
    "helper.py": "def answer():\n    return 42\n",
    "evil_rebind.py": "import helper\nhelper.answer = lambda: 0\n",
    "reads_stdin.py": "import sys\nDATA = sys.stdin.read()\n",
    # fails in the zygote and its trial (their argv[0] is the server's file), as a passing permission error would;
    # imports in a run
    "fails_once.py": "import sys\nif sys.argv[0].endswith('zygote_server.py'):\n    raise PermissionError('not now')\n",
}

# The traces torch._dynamo and transformers leave on every import, made as they make them (probes/zygote.py:
# inert_rebinding, inert_environ, inert_finder), and the same kinds of trace made by other packages.
INERT = {
    "torch/_compile.py": "import functools\n"
                         "def _disable_dynamo(fn):\n"
                         "    @functools.wraps(fn)\n"
                         "    def inner(*args, **kwargs):\n"
                         "        return fn(*args, **kwargs)\n"
                         "    return inner\n",
    "torch/_inductor/__init__.py": "",
    "torch/_inductor/runtime/__init__.py": "",
    "torch/_inductor/runtime/cache_dir_utils.py": "import os, tempfile\n"
                                                 "def default_cache_dir():\n"
                                                 "    return os.path.join(tempfile.gettempdir(), 'torchinductor_test')\n"
                                                 "def cache_dir():\n"
                                                 "    found = os.path.abspath(os.environ.get('TORCHINDUCTOR_CACHE_DIR') or "
                                                 "default_cache_dir())\n"
                                                 "    os.environ['TORCHINDUCTOR_CACHE_DIR'] = found\n"
                                                 "    return found\n",
    "torch/_dynamo/__init__.py": "import torch\n"
                                 "from torch._compile import _disable_dynamo\n"
                                 "from torch._inductor.runtime.cache_dir_utils import cache_dir\n"
                                 "CACHE = cache_dir()\n"
                                 "torch.manual_seed = _disable_dynamo(torch.manual_seed)\n",
    # transformers puts a lazy module of itself in sys.modules, and its processing_utils executes its __init__ again
    "transformers/__init__.py": "import sys\n"
                                "from transformers.utils.import_utils import _LazyModule, _LegacyModuleAliasFinder\n"
                                "if not any(isinstance(f, _LegacyModuleAliasFinder) for f in sys.meta_path):\n"
                                "    sys.meta_path.append(_LegacyModuleAliasFinder())\n"
                                "sys.modules[__name__] = _LazyModule(__name__, __file__)\n",
    "transformers/utils/__init__.py": "",
    "transformers/utils/import_utils.py": "import importlib.util, os, sys, types\n"
                                          "class _LegacyModuleAliasFinder:\n"
                                          "    def find_spec(self, fullname, path=None, target=None):\n"
                                          "        return None\n"
                                          "class _LazyModule(types.ModuleType):\n"
                                          "    def __init__(self, name, file):\n"
                                          "        super().__init__(name)\n"
                                          "        self.__file__ = file\n"
                                          "        self.__path__ = [os.path.dirname(file)]\n"
                                          "def direct_transformers_import(path):\n"
                                          "    spec = importlib.util.spec_from_file_location(\n"
                                          "        'transformers', os.path.join(path, '__init__.py'),\n"
                                          "        submodule_search_locations=[path])\n"
                                          "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
                                          "    return sys.modules['transformers']\n",
    "transformers/processing_utils.py": "import os\n"
                                        "from transformers.utils.import_utils import direct_transformers_import\n"
                                        "transformers_module = direct_transformers_import(os.path.dirname(__file__))\n",
    # a module of another package that puts a copy of `helper` (executed again) in its place
    "evil_replace.py": "import importlib.util, sys, helper\n"
                       "spec = importlib.util.spec_from_file_location('helper', helper.__file__)\n"
                       "copy = importlib.util.module_from_spec(spec)\n"
                       "spec.loader.exec_module(copy)\n"
                       "sys.modules['helper'] = copy\n",
    # a wrapper of torch.manual_seed of its own (functools.wraps, but not torch's guard): it adds one to the seed
    "evil_seed.py": "import functools, torch\n"
                    "_old = torch.manual_seed\n"
                    "@functools.wraps(_old)\n"
                    "def manual_seed(seed):\n"
                    "    return _old(seed + 1)\n"
                    "torch.manual_seed = manual_seed\n",
    "evil_finder.py": "import sys\n"
                      "class _LegacyModuleAliasFinder:\n"
                      "    def find_spec(self, fullname, path=None, target=None):\n"
                      "        return None\n"
                      "sys.meta_path.insert(0, _LegacyModuleAliasFinder())\n",
    "evil_env.py": "import os\nos.environ['TORCHINDUCTOR_CACHE_DIR'] = os.path.join(os.sep, 'elsewhere')\n",
}
MODULES.update(INERT)
# A package whose import makes a module from generated source, with no file and a name of its own (as
# torch.distributed.nn makes _remote_module_non_scriptable): no finder knows that module, its maker's import makes it
# A package of a clean module and one that leaves a trace, and a package that imports only the clean one
MODULES["mixed/__init__.py"] = ""
MODULES["mixed/clean.py"] = "def answer():\n    return 42\n"
MODULES["mixed/dirty.py"] = "import builtins\nbuiltins.MIXED_LEAK = 'mixed.dirty'\n"
MODULES["uses_clean.py"] = "from mixed.clean import answer\n"
MODULES["maker/__init__.py"] = (
    "import importlib.abc, importlib.util, sys\n"
    "class _Source(importlib.abc.Loader):\n"
    "    def exec_module(self, module):\n"
    "        exec('VALUE = 7', module.__dict__)\n"
    "if '_made_by_maker' not in sys.modules:\n"
    "    spec = importlib.util.spec_from_loader('_made_by_maker', _Source(), origin='maker-generated')\n"
    "    made = importlib.util.module_from_spec(spec)\n"
    "    sys.modules['_made_by_maker'] = made\n"
    "    spec.loader.exec_module(made)\n"
    "MADE = sys.modules['_made_by_maker']\n")

# Imports every module that leaves a trace: the zygote learns them from its report.
LEARN = "import evil_dtype, evil_builtin, evil_rebind, reads_stdin, torch, helper\nprint('learned')\n"

# What a probe that never imports them sees: in a fresh process, float32, no LEAKED builtin, helper's own answer.
CHECK = """\
import builtins, sys
import torch, helper
leaks = []
if torch.get_default_dtype() != "float32":
    leaks.append("torch default dtype " + torch.get_default_dtype())
if hasattr(builtins, "LEAKED"):
    leaks.append("builtin LEAKED")
if helper.answer() != 42:
    leaks.append("helper.answer rebound")
print("LEAKS: " + ", ".join(leaks) if leaks else "clean")
sys.exit(2 if leaks else 0)
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zygote-faults") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next(root.glob("lib/python*/site-packages"))
    for name, text in MODULES.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    return root / "bin" / "python"


@pytest.fixture()
def probes(tmp_path: Path) -> Path:
    folder = tmp_path / "probes"
    folder.mkdir()
    (folder / "learn.py").write_text(LEARN)
    (folder / "check.py").write_text(CHECK)
    return folder


@pytest.fixture()
def started(venv: Path) -> Iterator[list[Zygote]]:
    """Zygotes a test starts (closed after it); the venv's preload list is removed first."""
    (venv.parent.parent / PRELOAD_FILE).unlink(missing_ok=True)
    found: list[Zygote] = []
    yield found
    for zygote in found:
        zygote.close()


def _start(venv: Path, started: list[Zygote], events: list[Event] | None = None) -> Zygote:
    env = process.child_env({"PYTHONDONTWRITEBYTECODE": "1"})
    zygote = Zygote(venv, env=env, report=(events.append if events is not None else lambda _: None))
    started.append(zygote)
    assert zygote.broken is None, zygote.broken
    return zygote


def _env(cwd: Path) -> dict[str, str]:
    return process.child_env({"PYTHONPATH": str(cwd), "PYTHONDONTWRITEBYTECODE": "1"})


def _fresh(argv: list[str], cwd: Path) -> tuple[int, bytes]:
    proc = subprocess.run(argv, cwd=cwd, env=_env(cwd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, check=False, timeout=60)
    return proc.returncode, proc.stdout


def _warm(zygote: Zygote, argv: list[str], cwd: Path, timeout: float = 60) -> tuple[int, bytes]:
    ran = zygote.run(argv, cwd=cwd, env=_env(cwd), timeout=timeout)
    assert ran is not None, zygote.broken
    return ran.returncode, ran.output


def _settled(zygote: Zygote) -> None:
    """Wait for the zygote's learning (a preload in flight) to end."""
    assert zygote.settled(60)


# -- 1. only its own vpatch ----------------------------------------------------------------------------------------

CLIENT = """\
import json, os, socket, sys
address, payload, python = sys.argv[1:4]
read, write = os.pipe()
try:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.connect(address)
    request = {"argv": [python, payload], "cwd": "/", "env": {}}
    socket.send_fds(conn, [json.dumps(request).encode()], [write])
    conn.settimeout(5)
    print("answer", conn.recv(1 << 16) or b"(closed)", flush=True)
except OSError as exc:
    print("refused", type(exc).__name__, flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_no_other_client_may_run_code_through_the_zygote(venv: Path, started: list[Zygote], tmp_path: Path) -> None:
    events: list[Event] = []
    zygote = _start(venv, started, events)
    payload = tmp_path / "payload.py"
    proof = tmp_path / "ran"
    payload.write_text(f"open({str(proof)!r}, 'w').write('payload ran')\n")
    # a python that uid 65534 may run: the system's, on the default search path (ours may lie in root's home)
    client = ["env", f"PATH={os.defpath}", "python3", "-c", CLIENT, zygote.address, str(payload), str(venv)]
    other_uid = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *client]
    if subprocess.run([*other_uid[:4], *client[:3], "-c", "pass"], capture_output=True).returncode != 0:
        pytest.skip("no python on the default search path that another uid may run")

    # another user cannot even reach the socket (its folder is 0700)
    reached = subprocess.run(other_uid, capture_output=True, text=True, timeout=30)
    assert reached.stdout.strip() == "refused PermissionError", reached
    # with the folder and the socket opened to all, the zygote itself refuses it (its uid), as it refuses a
    # process of our own uid that is not vpatch (its pid)
    os.chmod(Path(zygote.address).parent, 0o777)
    os.chmod(zygote.address, 0o777)
    as_other = subprocess.run(other_uid, capture_output=True, text=True, timeout=30)
    as_us = subprocess.run(client, capture_output=True, text=True, timeout=30)

    for answered in (as_other, as_us):
        # closed on it, unanswered (the connection closed, or reset while it wrote)
        assert answered.stdout.strip() in ("answer b'(closed)'", "refused BrokenPipeError",
                                           "refused ConnectionResetError"), answered
    deadline = time.monotonic() + 10
    while len(zygote.refusals) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {uid for _, uid in zygote.refusals} == {65534, os.getuid()}
    assert [e for e in events if e.step == "refused a client"]
    assert not proof.exists()  # nothing ran
    assert zygote.broken is None
    (tmp_path / "ok.py").write_text("print('vpatch itself is served')\n")
    assert _warm(zygote, [str(venv), str(tmp_path / "ok.py")], tmp_path) == (0, b"vpatch itself is served\n")


# -- 2. faithful to a fresh process ----------------------------------------------------------------------------------

def test_a_module_whose_import_leaves_a_trace_is_never_preloaded(venv: Path, started: list[Zygote],
                                                                  probes: Path) -> None:
    learn, check = [str(venv), str(probes / "learn.py")], [str(venv), str(probes / "check.py")]
    fresh = _fresh(check, probes)
    assert fresh == (0, b"clean\n")

    zygote = _start(venv, started)
    assert _warm(zygote, learn, probes) == (0, b"learned\n")
    _settled(zygote)
    assert _warm(zygote, check, probes) == fresh

    recorded = json.loads((venv.parent.parent / PRELOAD_FILE).read_text())
    assert {"evil_dtype", "evil_builtin", "evil_rebind"} <= set(recorded["refused"])
    assert {"torch", "helper", "reads_stdin"} <= set(recorded["preload"])  # those leave no trace
    # the next command's zygote, from that list, the same
    again = _start(venv, started)
    assert _warm(again, check, probes) == fresh


def test_a_recorded_list_that_leaves_a_trace_never_makes_a_valid_probe_invalid(venv: Path, started: list[Zygote],
                                                                                probes: Path) -> None:
    check = [str(venv), str(probes / "check.py")]
    (venv.parent.parent / PRELOAD_FILE).write_text(json.dumps({"preload": ["torch", "evil_dtype", "helper",
                                                                           "evil_rebind", "evil_builtin"]}))
    events: list[Event] = []
    zygote = _start(venv, started, events)

    assert _warm(zygote, check, probes) == _fresh(check, probes) == (0, b"clean\n")
    recorded = json.loads((venv.parent.parent / PRELOAD_FILE).read_text())
    assert "evil_dtype" in recorded["refused"] and "evil_dtype" not in recorded["preload"]


LEARN_INERT = "import torch._dynamo, transformers, evil_seed, evil_finder, evil_env\nprint('learned')\n"
# A probe of vLLM's kind: it imports torch._dynamo and transformers (vllm does), and sees what a fresh run sees.
CHECK_INERT = """\
import os, sys
import torch, torch._dynamo, transformers
print(torch.manual_seed(5), torch.manual_seed.__wrapped__.__name__, os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
print([type(f).__name__ for f in sys.meta_path])
"""


def test_the_inert_traces_of_torch_dynamo_and_transformers_are_preloaded_the_same_traces_of_others_are_not(
        venv: Path, started: list[Zygote], probes: Path) -> None:
    """torch._dynamo wraps torch.manual_seed in its guard and sets TORCHINDUCTOR_CACHE_DIR; transformers appends
    a finder of its renamed modules: refused, a run of vLLM imported both itself (1.6 s a run). Now preloaded, and
    a run sees what a fresh one sees; another package's wrapper, finder or value is still refused."""
    (probes / "learn_inert.py").write_text(LEARN_INERT)
    (probes / "check_inert.py").write_text(CHECK_INERT)
    learn, check = [str(venv), str(probes / "learn_inert.py")], [str(venv), str(probes / "check_inert.py")]
    fresh = _fresh(check, probes)
    assert fresh[0] == 0 and fresh[1].startswith(b"5 manual_seed "), fresh
    # the recorded refusals of an older leak check (no "rules") are tried again under this one
    (venv.parent.parent / PRELOAD_FILE).write_text(json.dumps({"preload": [], "refused": ["transformers"]}))

    zygote = _start(venv, started)
    assert _warm(zygote, learn, probes) == (0, b"learned\n")
    _settled(zygote)
    assert _warm(zygote, check, probes) == fresh

    recorded = json.loads((venv.parent.parent / PRELOAD_FILE).read_text())
    assert {"torch._dynamo", "transformers"} <= set(recorded["preload"]), recorded
    assert {"evil_seed", "evil_finder", "evil_env"} <= set(recorded["refused"]), recorded
    assert recorded["rules"] == zygote_module.LEAK_RULES
    again = _start(venv, started)  # the next command's zygote, from that list
    assert _warm(again, check, probes) == fresh


# Learned by one run, what a probe then sees, what a fresh run prints, and what the list must hold or refuse:
# torch.distributed.nn makes _remote_module_non_scriptable at import from generated source, a module of no file that
# no finder knows, read as another package to import first (its maker never learned clean, a list naming it did
# not hold); a learning round refuses a package's group (mixed.dirty leaves a trace, mixed.clean goes with it), then
# imports mixed.clean clean with a package that imports it, and recorded it both preloaded and refused (the next
# command's zygote found its importer "imports a module refused before")
LISTS_THAT_HOLD = {
    "made": ("import maker\nprint('learned')\n",
             "import sys, maker\nprint(maker.MADE.VALUE, maker.MADE is sys.modules['_made_by_maker'])\n",
             b"7 True\n", {"maker"}, set()),
    "refused-with-its-group": ("import uses_clean, mixed.dirty\nprint('learned')\n",
                               "import builtins, uses_clean\n"
                               "print(uses_clean.answer(), hasattr(builtins, 'MIXED_LEAK'))\n",
                               b"42 False\n", {"uses_clean", "mixed.clean"}, {"mixed.dirty"}),
}


def _holds_in_the_next_command(venv: Path, started: list[Zygote], check: list[str], probes: Path,
                               fresh: tuple[int, bytes]) -> None:
    events: list[Event] = []
    again = _start(venv, started, events)  # the next command's zygote, from the list recorded
    assert _warm(again, check, probes) == fresh
    assert again.broken is None and not [e for e in events if "does not hold" in e.step], events


@pytest.mark.parametrize("case", sorted(LISTS_THAT_HOLD))
def test_a_list_learned_from_nothing_holds_in_the_next_command(venv: Path, started: list[Zygote], probes: Path,
                                                                case: str) -> None:
    learn_text, check_text, expected, preloaded, refused = LISTS_THAT_HOLD[case]
    (probes / "learn_case.py").write_text(learn_text)
    (probes / "check_case.py").write_text(check_text)
    learn, check = [str(venv), str(probes / "learn_case.py")], [str(venv), str(probes / "check_case.py")]
    fresh = _fresh(check, probes)
    assert fresh == (0, expected), fresh

    zygote = _start(venv, started)
    assert _warm(zygote, learn, probes) == (0, b"learned\n")
    _settled(zygote)
    assert _warm(zygote, check, probes) == fresh
    recorded = json.loads((venv.parent.parent / PRELOAD_FILE).read_text())
    assert preloaded <= set(recorded["preload"]) and refused <= set(recorded["refused"]), recorded
    assert len(recorded["preload"]) == len(set(recorded["preload"])), recorded  # each name once
    assert not set(recorded["preload"]) & set(recorded["refused"]), recorded
    _holds_in_the_next_command(venv, started, check, probes, fresh)


REEXEC_FIRST = "import transformers, helper\nprint('learned')\n"
REEXEC_THEN = "import transformers.processing_utils, evil_replace\nprint('learned')\n"
CHECK_REEXEC = """\
import sys, helper, transformers
first = sys.modules["transformers"]
import transformers.processing_utils as processing
print(type(first).__name__, processing.transformers_module is sys.modules["transformers"], helper.answer())
"""


def test_transformers_executed_again_by_its_processing_utils_is_preloaded_another_replaced_module_is_not(
        venv: Path, started: list[Zygote], probes: Path) -> None:
    """transformers.processing_utils executes transformers/__init__.py again, which puts a new lazy module in
    sys.modules: read as "it rebinds transformers.__name__" where transformers was preloaded first (a recorded
    list imports it first, or an earlier round), so the list learned from nothing did not hold in the next command.
    A module of another package replaced by a copy of itself is still refused."""
    for name, text in (("first.py", REEXEC_FIRST), ("then.py", REEXEC_THEN), ("check_reexec.py", CHECK_REEXEC)):
        (probes / name).write_text(text)
    check = [str(venv), str(probes / "check_reexec.py")]
    fresh = _fresh(check, probes)
    assert fresh == (0, b"_LazyModule True 42\n"), fresh

    zygote = _start(venv, started)
    for script in ("first.py", "then.py"):  # two rounds: transformers is preloaded before processing_utils is tried
        assert _warm(zygote, [str(venv), str(probes / script)], probes) == (0, b"learned\n")
        _settled(zygote)
    assert _warm(zygote, check, probes) == fresh
    recorded = json.loads((venv.parent.parent / PRELOAD_FILE).read_text())
    assert {"transformers", "transformers.processing_utils"} <= set(recorded["preload"]), recorded
    assert "evil_replace" in recorded["refused"], recorded

    _holds_in_the_next_command(venv, started, check, probes, fresh)


GENERATORS = "import random, os\nprint(random.random(), os.getpid() == os.getsid(0))\n"


def test_each_child_draws_new_random_numbers_and_may_start_a_session(venv: Path, started: list[Zygote],
                                                                      tmp_path: Path) -> None:
    (tmp_path / "gen.py").write_text(GENERATORS)
    (tmp_path / "session.py").write_text("import os\nos.setsid()\nprint('a session of its own')\n")
    zygote = _start(venv, started)
    argv = [str(venv), str(tmp_path / "gen.py")]

    outputs = {_warm(zygote, argv, tmp_path)[1] for _ in range(3)}

    assert len(outputs) == 3  # as three fresh processes: three draws
    assert all(line.endswith(b" False\n") for line in outputs)  # not a session leader, as a fresh probe is not
    session = [str(venv), str(tmp_path / "session.py")]
    assert _warm(zygote, session, tmp_path) == _fresh(session, tmp_path) == (0, b"a session of its own\n")


# -- 4. every wait has a deadline, nothing a run starts outlives it ------------------------------------------------

def test_a_stopped_zygote_gives_the_run_back_within_a_deadline(venv: Path, started: list[Zygote], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zygote_module, "ANSWER_S", 2.0, raising=False)
    (tmp_path / "ok.py").write_text("print('ok')\n")
    zygote = _start(venv, started)
    os.kill(zygote.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        ran = zygote.run([str(venv), str(tmp_path / "ok.py")], cwd=tmp_path, env=_env(tmp_path), timeout=60)
        took = time.monotonic() - began
    finally:
        os.kill(zygote.pid, signal.SIGCONT)
    assert ran is None and zygote.broken is not None  # the runner runs it fresh
    assert took < 10


def test_a_module_that_reads_stdin_at_import_reads_nothing(venv: Path, started: list[Zygote], probes: Path) -> None:
    (probes / "stdin.py").write_text("import reads_stdin\nprint(repr(reads_stdin.DATA))\n")
    argv = [str(venv), str(probes / "stdin.py")]
    zygote = _start(venv, started)

    began = time.monotonic()
    first = _warm(zygote, argv, probes)
    _settled(zygote)  # the zygote imports it: stdin is /dev/null there too
    second = _warm(zygote, argv, probes)

    assert first == second == _fresh(argv, probes) == (0, b"''\n")
    assert time.monotonic() - began < 30
    assert "reads_stdin" in json.loads((venv.parent.parent / PRELOAD_FILE).read_text())["preload"]


# A probe that starts a daemon in a session of its own, which keeps the probe's stdout, then sleeps or exits.
DAEMON = """\
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print("daemon", os.getpid(), flush=True)
        time.sleep(120)
    os._exit(0)
time.sleep(0.5)
if sys.argv[1] == "sleep":
    time.sleep(120)
"""


@pytest.mark.parametrize("mode", ["sleep", "exit"])
def test_a_run_s_daemons_in_sessions_of_their_own_end_with_it(venv: Path, started: list[Zygote], tmp_path: Path,
                                                              mode: str) -> None:
    (tmp_path / "daemon.py").write_text(DAEMON)
    zygote = _start(venv, started)

    began = time.monotonic()
    ran = zygote.run([str(venv), str(tmp_path / "daemon.py"), mode], cwd=tmp_path, env=_env(tmp_path), timeout=3)
    took = time.monotonic() - began

    assert ran is not None and ran.timed_out == (mode == "sleep")
    assert took < 15  # the timeout (3 s) and the end of the daemon, not the daemon's 120 s
    daemon = int(ran.output.split()[1])
    assert gone(daemon, within=10)


@pytest.mark.parametrize(("warm", "mode"), [(False, "sleep"), (False, "exit"), (True, "exit")])
def test_the_runner_ends_a_run_s_daemons_both_ways(toy_upstream: ToyUpstream, tmp_path: Path, warm: bool,
                                                   mode: str) -> None:
    from helpers.probefiles import write_probe

    from vpatch.probes import runner as probes
    from vpatch.probes.runner import ProbeOutcome

    probe = write_probe(tmp_path / "probes", f'kind: command\nrun: ["{{python}}", "{{probe_dir}}/check.py", "{mode}"]'
                        "\ntimeout: 3\n", DAEMON)
    began = time.monotonic()
    with probe_runs.Session(cache=tmp_path / "cache", jobs=1, zygote=warm) as session:
        result = probes.run_probe(toy_upstream.path, probe, "v1.0", session=session)
    took = time.monotonic() - began

    assert result.outcome is (ProbeOutcome.ERROR if mode == "sleep" else ProbeOutcome.PASS), result
    assert took < 20  # not the daemon's 120 s
    daemon = int(result.detail.split("daemon ")[1].split()[0])
    assert gone(daemon, within=10)


# -- 5. robust state files -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ['{"preload": 5}', '{"preload": [1, 2]}', "[]", "{not json"])
def test_a_malformed_preload_list_is_ignored_with_a_warning_naming_it(venv: Path, started: list[Zygote],
                                                                       tmp_path: Path, text: str) -> None:
    (venv.parent.parent / PRELOAD_FILE).write_text(text)
    (tmp_path / "ok.py").write_text("print('ok')\n")
    events: list[Event] = []
    zygote = _start(venv, started, events)

    assert _warm(zygote, [str(venv), str(tmp_path / "ok.py")], tmp_path) == (0, b"ok\n")
    warnings = [e for e in events if e.step == "warning"]
    assert warnings and str(venv.parent.parent / PRELOAD_FILE) in warnings[0].detail


def test_a_probe_that_replaces_json_dumps_cannot_break_the_protocol(venv: Path, started: list[Zygote],
                                                                     tmp_path: Path) -> None:
    (tmp_path / "dumps.py").write_text("import json\njson.dumps = lambda *a, **k: 'not json'\njson.loads = None\n"
                                       "print('replaced')\n")
    argv = [str(venv), str(tmp_path / "dumps.py")]
    zygote = _start(venv, started)

    assert _warm(zygote, argv, tmp_path) == _fresh(argv, tmp_path) == (0, b"replaced\n")
    assert _warm(zygote, argv, tmp_path) == (0, b"replaced\n") and zygote.broken is None


SLOW = "import sys, time\nif sys.argv[0].endswith('zygote_server.py'):\n    time.sleep(60)  # in the zygote or its trial, not in a probe\n"


def test_an_interrupted_import_is_never_recorded(venv: Path, started: list[Zygote], tmp_path: Path) -> None:
    site = next(venv.parent.parent.glob("lib/python*/site-packages"))
    (site / "slow_in_zygote.py").write_text(SLOW)
    (tmp_path / "slow.py").write_text("import slow_in_zygote, helper\nprint('ran')\n")
    zygote = _start(venv, started)

    assert _warm(zygote, [str(venv), str(tmp_path / "slow.py")], tmp_path) == (0, b"ran\n")
    time.sleep(1)  # the zygote tries slow_in_zygote apart, and stalls there
    zygote.close()  # the command ends (Ctrl-C) meanwhile

    recorded = (venv.parent.parent / PRELOAD_FILE)
    names = json.loads(recorded.read_text()) if recorded.exists() else {"preload": [], "refused": []}
    assert "slow_in_zygote" not in names["preload"] and "slow_in_zygote" not in names["refused"]


# -- 3. only verdicts are cached ------------------------------------------------------------------------------------

HOLD = "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\n" \
       "print('held', flush=True)\ntime.sleep(120)\n"


def test_a_run_folder_is_kept_while_its_owner_holds_it_even_where_its_pid_looks_dead(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    runs = tmp_path / "cache" / "probe-runs"
    # a vpatch in another PID namespace: its pid is none of ours, and it holds its folder's lock
    theirs = runs / f"run-{dead}-abcd"
    (theirs / "tree").mkdir(parents=True)
    (theirs / ".owner").touch()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(theirs / ".owner")], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with probe_runs.Session(cache=tmp_path / "cache", zygote=False):
            pass
        assert (theirs / "tree").is_dir()
    finally:
        holder.kill()
        holder.wait()
    with probe_runs.Session(cache=tmp_path / "cache", zygote=False):  # its owner gone, the next command removes it
        pass
    assert not theirs.exists()


# A probe whose workspace another process removes while it runs: it finds no tree and says "the bug is there".
VANISH = "import os, shutil, sys\nshutil.rmtree(os.path.dirname(os.path.dirname(os.getcwd())))\n" \
         "print('no tree, so: the bug is there')\nsys.exit(1)\n"


@pytest.mark.parametrize("warm", [True, False])
def test_a_tree_removed_under_a_run_is_an_error_never_a_cached_verdict(toy_upstream: ToyUpstream, tmp_path: Path,
                                                                        warm: bool) -> None:
    from helpers.probefiles import write_probe

    from vpatch.base import VpatchError
    from vpatch.probes import runner as probes

    probe = write_probe(tmp_path / "probes", 'kind: command\nrun: ["{python}", "{probe_dir}/check.py"]\n', VANISH)
    cache = tmp_path / "cache"
    with probe_runs.Session(cache=cache, jobs=1, zygote=warm) as session, \
            pytest.raises(VpatchError, match="was removed while it ran") as caught:
        probes.run_probe(toy_upstream.path, probe, "v1.0", session=session)

    assert "run the command again" in (caught.value.hint or "")
    assert not list((cache / "probe-results").rglob("*.json"))  # nothing cached


def test_a_probe_venv_that_cannot_be_built_is_an_error_not_an_invalid_probe(toy_upstream: ToyUpstream,
                                                                             tmp_path: Path) -> None:
    from helpers.probefiles import write_probe

    from vpatch.probes import runner as probes
    from vpatch.probes.env import EnvError

    missing = tmp_path / "no-such-package"
    probe = write_probe(tmp_path / "probes", f'kind: command\nrun: ["{{python}}", "{{probe_dir}}/check.py"]\n'
                        f'requirements: ["{missing}"]\n', "print(1)\n")

    with pytest.raises(EnvError, match="cannot resolve the probe requirements"):
        probes.run_probe(toy_upstream.path, probe, "v1.0", cache=tmp_path / "cache")
    with probe_runs.Session(cache=tmp_path / "cache", jobs=1) as session, pytest.raises(EnvError):
        probes.validation(toy_upstream.path, probe, "0001.patch", base="v1.0", patched="v1.0",
                          session=session)


def test_a_module_whose_import_fails_in_the_zygote_is_left_out_not_refused_for_good(venv: Path, started: list[Zygote],
                                                                                     tmp_path: Path) -> None:
    (tmp_path / "fails.py").write_text("import fails_once, helper\nprint('ran')\n")
    argv = [str(venv), str(tmp_path / "fails.py")]
    zygote = _start(venv, started)

    assert _warm(zygote, argv, tmp_path) == (0, b"ran\n")
    _settled(zygote)
    assert _warm(zygote, argv, tmp_path) == (0, b"ran\n")

    recorded = json.loads((venv.parent.parent / PRELOAD_FILE).read_text())
    assert "fails_once" not in recorded["refused"] and "fails_once" not in recorded["preload"]
    assert "helper" in recorded["preload"]


def test_a_timed_out_probe_s_hint_gives_the_timeout_as_the_reason(toy_upstream: ToyUpstream, tmp_path: Path) -> None:
    from helpers.probefiles import write_probe

    from vpatch.probes import runner as probes

    probe = write_probe(tmp_path / "probes", 'kind: command\nrun: ["{python}", "{probe_dir}/check.py"]\ntimeout: 2\n',
                        "import time\nprint('the fix is there', flush=True)\ntime.sleep(60)\n")
    with probe_runs.Session(cache=tmp_path / "cache", jobs=1, zygote=False) as session:
        checked = probes.validation(toy_upstream.path, probe, "0001.patch", base="v1.0", patched="v1.0",
                                    session=session)

    assert not checked.ok
    assert checked.hint == "the probe could not decide: timed out after 2s"
