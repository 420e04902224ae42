"""The warm interpreter (probes/zygote.py): a child of the zygote runs a probe as a fresh `python probe.py` does,
what to preload is measured from the runs, nothing of vllm or of a tree reaches the zygote, and a zygote that
breaks leaves the runs to fresh processes with the same outcomes.

Real parts: a real venv (made with `python -m venv`, a "third-party" module written into its site-packages),
real forks and process groups; each probe is also run fresh, the way the runner runs it without a zygote, and
the two must agree."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ToyUpstream
from helpers.pids import gone

from vpatch.base import Event, process
from vpatch.probes import workspace as probe_runs
from vpatch.probes import zygote as zygote_module
from vpatch.probes.child import ZYGOTE_SERVER
from vpatch.probes.zygote import LEAK_RULES, OLD_PRELOAD_FILES, PRELOAD_FILE, Zygote

# A module of the venv that records, when it is imported, the variable a probe is started with.
HEAVY = "import os\nIMPORTED_WITH = os.environ.get('PROBE_FLAVOUR')\nIMPORTS = 0\n"

# A module of the venv that starts a thread when imported: a zygote that imported it could no longer fork safely.
THREADED = "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"

CONTRACT = """\
import os, signal, sys
import __main__
print("argv", sys.argv)
print("name", __name__, __main__.__file__ == __file__, __file__)
print("cwd", os.getcwd())
print("env", os.environ.get("PROBE_FLAVOUR"), os.environ.get("OPENBLAS_NUM_THREADS"), os.environ["PYTHONPATH"])
print("path", sys.path)
print("bytecode", sys.dont_write_bytecode)
print("stdin", sys.stdin.read())
print("vllm before", sorted(m for m in sys.modules if m == "vllm" or m.startswith(("vllm.", "treemod"))))
sys.stdout.flush()
print("to stderr", file=sys.stderr)
sys.stderr.flush()
print("to stdout again")
import heavy, vllm, treemod
heavy.IMPORTS += 1
print("heavy", heavy.IMPORTED_WITH, heavy.IMPORTS, "vllm from the tree", vllm.__file__.startswith(os.getcwd()))
mode = sys.argv[1]
if mode == "exit":
    sys.exit(int(sys.argv[2]))
if mode == "raise":
    def inner():
        raise ValueError("the probe broke")
    inner()
if mode == "signal":
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGTERM)
if mode == "message":
    sys.exit("a message exit")
if mode == "ending":  # how a run ends: its threads, then its exit handlers, then what its streams still hold
    import atexit, threading, time
    atexit.register(lambda: print("at exit, after the thread"))
    threading.Thread(target=lambda: (time.sleep(0.3), print("the thread ends after the script"))).start()
    print("left in stdout's buffer", end="")
if mode == "interrupt":  # dies of SIGINT after its exit handlers, as python does
    import atexit
    atexit.register(lambda: print("at exit, before the signal"))
    raise KeyboardInterrupt
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zygote-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next(root.glob("lib/python*/site-packages"))
    (site / "heavy.py").write_text(HEAVY)
    (site / "threaded.py").write_text(THREADED)
    # two packages that import each other, as asyncio and its accelerator _asyncio do
    (site / "cyc.py").write_text("import _cyc\nVALUE = 1\n")
    (site / "_cyc.py").write_text("import cyc\n")
    return root / "bin" / "python"


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A tree with a vllm package and a module of its own, and the probe script beside it (not in it)."""
    root = tmp_path / "tree"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "treemod.py").write_text("")
    (tmp_path / "probes").mkdir()
    (tmp_path / "probes" / "probe.py").write_text(CONTRACT)
    return root


def zygote_env() -> dict[str, str]:
    """What a zygote started by hand here runs with (a Session starts its own with `Session.run_env`)."""
    return process.child_env({"PYTHONDONTWRITEBYTECODE": "1"})


def _env(tree: Path, **extra: str) -> dict[str, str]:
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p),
           "PYTHONDONTWRITEBYTECODE": "1", **extra}
    return process.child_env(env)


def _fresh(argv: list[str], tree: Path, env: dict[str, str]) -> tuple[int, bytes]:
    proc = subprocess.run(argv, cwd=tree, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, check=False)
    return proc.returncode, proc.stdout


@pytest.fixture()
def zygote(venv: Path) -> Iterator[Zygote]:
    """A zygote of the venv, nothing recorded to preload; started by the test's first use (the environment it
    is started with is the test's own: pytest's PYTEST_CURRENT_TEST differs in a fixture's setup)."""
    (venv.parent.parent / PRELOAD_FILE).unlink(missing_ok=True)
    started: list[Zygote] = []

    class Lazy:
        def __getattr__(self, name: str) -> object:
            if not started:
                started.append(Zygote(venv, env=zygote_env()))
                assert started[0].broken is None, started[0].broken
            return getattr(started[0], name)

    yield Lazy()  # type: ignore[misc]
    for found in started:
        found.close()


@pytest.mark.parametrize("args", [["plain"], ["exit", "1"], ["exit", "3"], ["exit", "256"], ["raise"], ["signal"],
                                  ["message"], ["ending"], ["interrupt"]])
def test_a_child_runs_the_probe_as_a_fresh_python_does(zygote: Zygote, venv: Path, tree: Path,
                                                       args: list[str]) -> None:
    argv = [str(venv), str(tree.parent / "probes" / "probe.py"), *args]
    env = _env(tree)
    assert zygote.fits(argv, env)

    ran = zygote.run(argv, cwd=tree, env=env, timeout=60)
    code, output = _fresh(argv, tree, env)

    assert ran is not None
    assert (ran.returncode, ran.output.decode()) == (code, output.decode())
    assert b"vllm before []" in output and b"heavy None 1 vllm from the tree True" in output
    expected = {"plain": 0, "raise": 1, "signal": -signal.SIGTERM, "message": 1, "ending": 0,
                "interrupt": -signal.SIGINT}
    assert code == (int(args[1]) % 256 if args[0] == "exit" else expected[args[0]])
    if args[0] == "ending":  # the child ends without the interpreter's teardown (zygote_server.end): in this order
        assert output.endswith(b"left in stdout's bufferthe thread ends after the script\nat exit, after the thread\n")
    if args[0] == "interrupt":
        assert b"\nKeyboardInterrupt\nat exit, before the signal\n" in output, output


@pytest.mark.parametrize("args", [["plain"], ["exit", "3"], ["signal"], ["message"]])
def test_a_child_runs_python_dash_m_as_a_fresh_python_does(zygote: Zygote, venv: Path, tree: Path,
                                                           args: list[str]) -> None:
    """`python -m module` (upstream's tests run as `python -m pytest`): the module as __main__, argv[0] its file,
    sys.path's first entry the working folder. (A traceback it ends with lacks runpy's frames: not compared.)"""
    (tree / "probemod.py").write_text(CONTRACT)
    argv = [str(venv), "-m", "probemod", *args]
    env = _env(tree)
    assert zygote.fits(argv, env)
    assert not zygote.fits([str(venv), "-m", "not a module"], env) and not zygote.fits([str(venv), "-m"], env)

    ran = zygote.run(argv, cwd=tree, env=env, timeout=60)
    code, output = _fresh(argv, tree, env)

    assert ran is not None
    assert ran.returncode == code and ran.output.decode().splitlines() == output.decode().splitlines()
    assert f"argv ['{tree / 'probemod.py'}'".encode() in output and f"path ['{tree}',".encode() in output
    assert code == {"plain": 0, "exit": 3, "signal": -signal.SIGTERM, "message": 1}[args[0]]


def test_the_zygote_s_command_line_is_its_file_and_arguments(zygote: Zygote, venv: Path) -> None:
    """What `ps` shows of it: the venv's python, the server's file of the package, the socket and vpatch's pid."""
    cmdline = Path(f"/proc/{zygote.pid}/cmdline").read_bytes().split(b"\0")[:-1]
    assert [c.decode() for c in cmdline] == [str(venv), str(ZYGOTE_SERVER), zygote.address, str(os.getpid())]
    assert ZYGOTE_SERVER.is_file() and ZYGOTE_SERVER.parent.parent.name == "probes"


def test_the_preload_is_measured_from_the_runs_and_never_holds_vllm_or_the_tree(zygote: Zygote, venv: Path,
                                                                                  tree: Path) -> None:
    argv = [str(venv), str(tree.parent / "probes" / "probe.py"), "plain"]
    first = zygote.run(argv, cwd=tree, env=_env(tree), timeout=60)
    second = zygote.run(argv, cwd=tree, env=_env(tree), timeout=60)

    assert first is not None and second is not None
    recorded = json.loads((venv.parent.parent / PRELOAD_FILE).read_text())
    assert "heavy" in recorded["preload"]
    assert not [m for m in recorded["preload"] if m.startswith(("vllm", "treemod", "probe"))], recorded
    # the second child found heavy imported (by the zygote: its counter is 0 in a fresh import, 1 after the
    # probe's own increment in the first child, which the zygote never sees), and no vllm nor tree module
    assert b"vllm before []" in second.output and b"heavy None 1 " in second.output


def test_saving_the_list_removes_the_second_list_an_older_vpatch_kept(zygote: Zygote, venv: Path, tree: Path) -> None:
    """An older vpatch kept a list for upstream's tests apart; nothing reads it now, and the one list's save removes it."""
    old = venv.parent.parent / OLD_PRELOAD_FILES[0]
    old.write_text(json.dumps({"preload": ["heavy"], "refused": [], "rules": LEAK_RULES}))
    ran = zygote.run([str(venv), str(tree.parent / "probes" / "probe.py"), "plain"], cwd=tree, env=_env(tree),
                     timeout=60)

    assert ran is not None and zygote.settled()
    assert "heavy" in json.loads((venv.parent.parent / PRELOAD_FILE).read_text())["preload"]
    assert not old.exists()


def test_a_package_that_imports_multiprocessing_is_preloaded(zygote: Zygote, venv: Path, tree: Path) -> None:
    """multiprocessing's import names the main module `__mp_main__` too: in the zygote that is the server's own file
    (run by path), no module of elsewhere (torch imports multiprocessing: refused, it took torch's whole family)."""
    site = next(venv.parent.parent.glob("lib/python*/site-packages"))
    (site / "uses_mp.py").write_text("import multiprocessing\nVALUE = 1\n")
    (tree.parent / "probes" / "mp.py").write_text("import uses_mp\nprint(uses_mp.VALUE)\n")
    argv = [str(venv), str(tree.parent / "probes" / "mp.py")]
    try:
        ran = zygote.run(argv, cwd=tree, env=_env(tree), timeout=60)
        assert ran is not None and ran.output == b"1\n"
        assert zygote.settled()
        assert "uses_mp" in json.loads((venv.parent.parent / PRELOAD_FILE).read_text())["preload"]
    finally:
        (site / "uses_mp.py").unlink()


def test_a_run_with_other_variables_goes_fresh_and_sees_them(zygote: Zygote, venv: Path, tree: Path) -> None:
    from conftest import KV_FIXED  # noqa: F401 - the toy upstream's fixture module is importable

    argv = [str(venv), str(tree.parent / "probes" / "probe.py"), "plain"]
    assert zygote.run(argv, cwd=tree, env=_env(tree), timeout=60) is not None  # heavy is preloaded now

    other = _env(tree, PROBE_FLAVOUR="sour")
    assert not zygote.fits(argv, other)  # heavy was imported without it: the run goes fresh
    code, output = _fresh(argv, tree, other)
    assert code == 0 and b"heavy sour 1 " in output


# A probe whose group outlives its timeout: it starts a grandchild, says both pids, and sleeps.
SLEEPER = """\
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(os.getpid(), child.pid, flush=True)
time.sleep(600)
"""


def test_a_timeout_kills_the_child_s_whole_group(zygote: Zygote, venv: Path, tree: Path) -> None:
    (tree.parent / "probes" / "sleeper.py").write_text(SLEEPER)
    argv = [str(venv), str(tree.parent / "probes" / "sleeper.py")]

    ran = zygote.run(argv, cwd=tree, env=_env(tree), timeout=3)

    assert ran is not None and ran.timed_out
    pids = [int(pid) for pid in ran.output.split()[:2]]
    assert len(pids) == 2 and pids[0] != zygote.pid
    assert all(gone(pid, within=30) for pid in pids)


def test_torch_works_in_a_child_of_a_zygote_that_preloaded_it() -> None:
    """The real probe venv (CPU torch, numpy): a child runs torch's thread pool and numpy's BLAS after the
    zygote imported both; skipped where the shipped probe venv is not built."""
    from conftest import REAL_CACHE

    from vpatch.probes.env import probe_venv, venv_root
    from vpatch.probes.file import Probe

    probe = Probe.load(Path(__file__).resolve().parents[2] / "patches" / "probes" / "0002-mamba-null-gap-free.yaml")
    key = probe.environment().key()
    if not (venv_root(REAL_CACHE) / key / "bin" / "python").exists():
        pytest.skip("the shipped probe venv is not built here")
    python = probe_venv(probe.environment(), cache=REAL_CACHE)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "torch_probe.py"
        script.write_text("import numpy, torch\n"
                          "a = torch.ones(256, 256)\n"
                          "print('torch', float((a @ a).sum()), torch.get_num_threads() >= 1)\n"
                          "print('numpy', float(numpy.ones((64, 64)).dot(numpy.ones((64, 64))).sum()))\n"
                          "print('drawn', numpy.random.rand(), float(torch.rand(1)))\n")
        found = Zygote(python, env=zygote_env())
        try:
            assert found.broken is None, found.broken
            env = process.child_env({"PYTHONDONTWRITEBYTECODE": "1"})
            argv = [str(python), str(script)]
            first = found.run(argv, cwd=Path(tmp), env=env, timeout=300)  # measures: torch and numpy preloaded
            second = found.run(argv, cwd=Path(tmp), env=env, timeout=300)
            third = found.run(argv, cwd=Path(tmp), env=env, timeout=300)  # a fork like the second
            assert found.broken is None, found.broken
        finally:
            found.close()
    expected = b"torch 16777216.0 True\nnumpy 262144.0\n"
    assert first is not None and second is not None
    assert (first.returncode, first.output[:len(expected)]) == (0, expected)
    assert (second.returncode, second.output[:len(expected)]) == (0, expected)
    # numpy's and torch's generators seeded anew in each child, as each fresh interpreter seeds them
    assert third is not None
    drawn = [ran.output.splitlines()[-1].split()[1:] for ran in (second, third)]
    assert drawn[0][0] != drawn[1][0] and drawn[0][1] != drawn[1][1], drawn


def test_a_killed_zygote_leaves_the_runs_to_fresh_processes(toy_upstream: ToyUpstream, tmp_path: Path) -> None:
    from helpers.probefiles import COMMAND_PROBE, SCRIPT, write_probe

    from vpatch.probes import runner as probes
    from vpatch.probes.runner import ProbeOutcome

    probe = write_probe(tmp_path / "probes", COMMAND_PROBE, SCRIPT)
    events: list[Event] = []
    with probe_runs.Session(cache=tmp_path / "cache", jobs=1, zygote=True, report=events.append) as session:
        python = probes.probe_venv(probe.environment(), cache=tmp_path / "cache")
        warm = session.zygote_for(python, wait=True)  # warm before the first run, which goes through it
        assert warm is not None
        first = probes.run_probe(toy_upstream.path, probe, "v1.0", session=session, report=events.append)
        assert warm.runs == 1
        os.kill(warm.pid, signal.SIGKILL)
        assert gone(warm.pid, within=30)
        second = probes.run_probe(toy_upstream.path, probe, "v1.0", session=session, report=events.append,
                                  use_cache=False)
    assert (first.outcome, first.detail) == (second.outcome, second.detail)
    assert first.outcome is ProbeOutcome.FAIL
    assert [e for e in events if e.subject == "probe zygote" and e.step == "fresh processes from now on"]
    # both runs ran: the one in the zygote's child and the fresh one
    assert (tmp_path / "probes" / "runs.log").read_text() == "run\nrun\n"


@contextlib.contextmanager
def _removed(module: Path) -> Iterator[None]:
    """`module` of the shared venv, and the preload list that names it, gone after the test."""
    try:
        yield
    finally:
        module.unlink(missing_ok=True)
        (module.parents[3] / PRELOAD_FILE).unlink(missing_ok=True)


def _slow_to_learn(venv: Path, tree: Path, seconds: int) -> tuple[list[str], Path]:
    """A probe importing a module of the shared venv whose trial in the zygote takes `seconds` (a fresh import takes
    none), with no preload list yet: the probe's argv, and the module (for `_removed`)."""
    module = next(venv.parent.parent.glob("lib/python*/site-packages")) / "slow_to_learn.py"
    module.write_text("import sys, time\nif sys.argv[0].endswith('zygote_server.py'):\n"
                      f"    time.sleep({seconds})  # its trial only\n")
    (tree.parent / "probes" / "slow.py").write_text("import slow_to_learn\nprint('ran')\n")
    (venv.parent.parent / PRELOAD_FILE).unlink(missing_ok=True)
    return [str(venv), str(tree.parent / "probes" / "slow.py")], module


def test_no_run_waits_for_the_warm_interpreter_to_start_or_to_learn(venv: Path, tree: Path,
                                                                   tmp_path: Path) -> None:
    """A session's zygote starts beside the runs (they go fresh until it is ready), and a run that comes while it
    imports what the runs taught it goes fresh too: the zygote says no at once, and counts it."""
    argv, module = _slow_to_learn(venv, tree, 6)
    with probe_runs.Session(cache=tmp_path / "cache", zygote=True) as session, _removed(module):
        assert session.zygote_for(venv) is None  # starting: this run goes fresh
        zygote = session.zygote_for(venv, wait=True)
        assert zygote is not None and not zygote.wait_for_imports
        first = zygote.run(argv, cwd=tree, env=_env(tree), timeout=60)  # teaches it slow_to_learn (6 s to try)
        assert first is not None and (first.returncode, first.output) == (0, b"ran\n")
        # learning from here (the lock is taken before the first run's answer returns): the next run is told no
        asked = time.monotonic()
        again = zygote.run(argv, cwd=tree, env=_env(tree), timeout=60)
        assert again is None and zygote.went_fresh == 1  # it was learning: no wait
        assert time.monotonic() - asked < 3
        assert zygote.settled(60)
        after = zygote.run(argv, cwd=tree, env=_env(tree), timeout=60)  # learned: it runs here again
        assert after is not None and after.output == b"ran\n" and zygote.runs == 2


@pytest.mark.parametrize("holds", [True, False], ids=["list-holds", "list-does-not-hold"])
def test_a_run_waits_for_a_recorded_list_never_for_learning(venv: Path, tree: Path, tmp_path: Path,
                                                          holds: bool) -> None:
    """The recorded list names slow_to_learn, whose import in the zygote takes 3 s: a session's first run waits for
    that import (shorter than the run's own imports in a fresh process beside it) and is forked with it preloaded.
    Where the list does not hold (it names a module that starts a thread), the zygote learns it again in the
    background, each package tried apart (3 s for slow_to_learn), and the run goes fresh without waiting for that."""
    argv, module = _slow_to_learn(venv, tree, 3)
    listed = ["slow_to_learn"] if holds else ["threaded", "slow_to_learn"]
    (venv.parent.parent / PRELOAD_FILE).write_text(json.dumps({"preload": listed, "refused": [], "rules": LEAK_RULES}))
    with probe_runs.Session(cache=tmp_path / "cache", zygote=True) as session, _removed(module):
        asked = time.monotonic()
        zygote = session.zygote_for(venv)
        waited = time.monotonic() - asked
        assert zygote is not None and zygote.broken is None
        ran = zygote.run(argv, cwd=tree, env=_env(tree), timeout=60)
        if holds:
            assert waited >= 3, waited  # the list's import
            assert ran is not None and ran.output == b"ran\n" and (zygote.runs, zygote.went_fresh) == (1, 0)
            assert "slow_to_learn" in zygote._preloaded
        else:
            assert waited < 3, waited  # not the learning: the run goes fresh meanwhile
            assert ran is None and zygote.went_fresh == 1 and zygote._lock.locked()
            assert zygote.settled(60) and "slow_to_learn" in zygote._preloaded and "threaded" in zygote._refused


@pytest.mark.parametrize("first", [False, True], ids=["warm", "first-learning"])
def test_a_warm_interpreter_forks_a_run_between_the_trials_of_what_it_learns(venv: Path, tree: Path, tmp_path: Path,
                                                                            first: bool,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The zygote learns slow_to_learn (12 s to try) with heavy preloaded already: warm from an earlier learning, or
    in its first learning, the request before (one module a request here, 500 for real: 8 for the shipped probes'
    first learning). A run that comes meanwhile neither goes fresh nor waits, but is forked as the zygote is (heavy
    preloaded, the module being learned not), and the learning goes on to the end. A first learning with nothing in
    yet still sends runs fresh: test_no_run_waits_for_the_warm_interpreter_to_start_or_to_learn."""
    argv, module = _slow_to_learn(venv, tree, 12)
    probes = tree.parent / "probes"
    (probes / "heavy_probe.py").write_text(
        "import sys\nthere = sorted(m for m in ('heavy', 'slow_to_learn') if m in sys.modules)\nimport heavy\n"
        "print(there)\n")  # what was preloaded of the two when the run began
    (probes / "both.py").write_text("import heavy\nimport slow_to_learn\nprint('ran')\n")
    heavy_argv = [str(venv), str(probes / "heavy_probe.py")]
    with probe_runs.Session(cache=tmp_path / "cache", zygote=True) as session, _removed(module):
        session.warm_up(venv)
        zygote = session.zygote_for(venv, wait=True)
        assert zygote is not None
        if first:
            monkeypatch.setattr(zygote_module, "CHUNK", 1)
            taught = zygote.run([str(venv), str(probes / "both.py")], cwd=tree, env=_env(tree), timeout=60)
        else:
            before = zygote.run(heavy_argv, cwd=tree, env=_env(tree), timeout=60)  # teaches it heavy
            assert before is not None and before.output == b"[]\n"
            assert zygote.settled(60) and "heavy" in zygote._preloaded
            taught = zygote.run(argv, cwd=tree, env=_env(tree), timeout=60)  # teaches it slow_to_learn
        assert taught is not None and taught.output == b"ran\n"
        started = time.monotonic()
        deadline = started + 10
        while not (zygote._beside and "heavy" in zygote._preloaded) and time.monotonic() < deadline:  # heavy in
            time.sleep(0.02)
        assert zygote._beside and zygote._lock.locked()
        meanwhile = zygote.run(heavy_argv, cwd=tree, env=_env(tree), timeout=60)
        took = time.monotonic() - started
        assert meanwhile is not None and meanwhile.returncode == 0, (zygote.broken, zygote.went_fresh)
        # forked from the zygote as it was: heavy there before the run imported it, slow_to_learn not yet
        assert meanwhile.output == b"['heavy']\n"
        assert (zygote.went_fresh, zygote.beside_learning) == (0, 1) and took < 8, took
        assert zygote._lock.locked()  # still learning: the run did not wait for it
        assert zygote.settled(60) and {"heavy", "slow_to_learn"} <= zygote._preloaded
        assert zygote.broken is None and zygote.runs == (2 if first else 3)


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_warm_interpreter_s_imports_hold_one_of_the_session_s_places_beside_one_run_at_least(
        venv: Path, tree: Path, tmp_path: Path, jobs: int) -> None:
    """Its imports are a process's work: with two places or more they hold one, so that the runs going fresh beside
    them do not starve them (on two cores a first run's learning took 63 s beside two fresh runs, 22 s beside one);
    with one place they hold none, and the run goes on beside them."""
    argv, module = _slow_to_learn(venv, tree, 8)
    with probe_runs.Session(cache=tmp_path / "cache", zygote=True, jobs=jobs) as session, _removed(module):
        session.warm_up(venv)
        assert session.busy == (1 if jobs > 1 else 0)  # taken before any run asks for a place
        zygote = session.zygote_for(venv, wait=True)
        assert zygote is not None and session.busy == 0  # started, nothing to import yet
        with session.slot():
            first = zygote.run(argv, cwd=tree, env=_env(tree), timeout=60)  # teaches it slow_to_learn
        assert first is not None and first.output == b"ran\n"
        deadline = time.monotonic() + 10
        while session.busy != (1 if jobs > 1 else 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert session.busy == (1 if jobs > 1 else 0)  # learning
        placed = threading.Event()

        def second_run() -> None:  # a second run asking for a place while the first holds one
            with session.slot():
                placed.set()

        with session.slot():  # one run goes on beside the learning, whatever the places (it never waits)
            assert zygote.run(argv, cwd=tree, env=_env(tree), timeout=60) is None  # it was learning: fresh
            if jobs > 1:
                beside = threading.Thread(target=second_run)
                beside.start()
                assert not placed.wait(1)  # two places: the learning's and the first run's
        if jobs > 1:
            assert placed.wait(10)  # the first run's place, freed
            beside.join(10)
        assert zygote.settled(60)
        assert session.busy == 0


def test_a_zygote_still_starting_when_the_command_ends_reports_nothing_after_it(venv: Path, tmp_path: Path) -> None:
    """The warm interpreter starts on a thread of its own, which may outlive the command; the command's output
    stream is closed after it (the CLI's runner closes it): nothing may be written to it then."""
    (venv.parent.parent / PRELOAD_FILE).unlink(missing_ok=True)
    stream = io.StringIO()

    def report(event: Event) -> None:
        stream.write(f"{event.subject}: {event.step}\n")  # ValueError once the stream is closed

    failures: list[threading.ExceptHookArgs] = []
    before, threading.excepthook = threading.excepthook, failures.append
    try:
        with probe_runs.Session(cache=tmp_path / "cache", zygote=True, report=report) as session:
            starting = session.warm_up(venv)
            assert starting is not None and starting.is_alive()
        stream.close()
        starting.join(60)
    finally:
        threading.excepthook = before
    assert not starting.is_alive()
    assert not failures, [f"{f.exc_type.__name__}: {f.exc_value}" for f in failures]


def test_a_probe_may_ask_for_a_fresh_process(tmp_path: Path) -> None:
    from helpers.probefiles import write_probe

    probe = write_probe(tmp_path, 'kind: command\nrun: ["{python}", "{probe_dir}/check.py"]\nfresh_process: true\n',
                        "print(1)\n")
    assert probe.fresh_process

    with pytest.raises(Exception, match="fresh_process: must be true or false"):
        write_probe(tmp_path, 'kind: command\nrun: ["{python}", "x.py"]\nfresh_process: "yes"\n', name="bad.yaml")


def test_a_module_that_starts_a_thread_is_tried_apart_and_never_preloaded(zygote: Zygote, venv: Path,
                                                                          tree: Path) -> None:
    (tree.parent / "probes" / "threads.py").write_text("import threaded, threading\nprint(threading.active_count())\n")
    argv = [str(venv), str(tree.parent / "probes" / "threads.py")]

    first = zygote.run(argv, cwd=tree, env=_env(tree), timeout=60)  # its report makes the zygote try threaded apart
    second = zygote.run(argv, cwd=tree, env=_env(tree), timeout=60)

    code, output = _fresh(argv, tree, _env(tree))
    assert (code, output) == (0, b"2\n")
    assert first is not None and (first.returncode, first.output) == (code, output)
    # tried in a child of its own, it never reached the zygote, which still forks: the run went through it
    assert second is not None and (second.returncode, second.output) == (code, output) and zygote.broken is None
    recorded = json.loads((venv.parent.parent / PRELOAD_FILE).read_text())
    assert "threaded" in recorded["refused"] and "threaded" not in recorded["preload"]
    again = Zygote(venv, env=zygote_env())  # the next command's zygote leaves it out
    try:
        assert again.broken is None
        ran = again.run(argv, cwd=tree, env=_env(tree), timeout=60)
        assert ran is not None and ran.output == output
    finally:
        again.close()


CYCLIC = "import cyc\nprint('cyc', cyc.VALUE)\n"


def test_a_recorded_list_with_packages_importing_each_other_holds_in_the_next_command(venv: Path,
                                                                                       tmp_path: Path) -> None:
    """The list learned in one command is imported by the next one's zygote as it is: packages that import each
    other (asyncio and _asyncio) were learned together and must not make the recorded list "not hold" (which
    re-learned the whole list in every command of the real probe venv)."""
    (venv.parent.parent / PRELOAD_FILE).unlink(missing_ok=True)
    script = tmp_path / "cyclic.py"
    script.write_text(CYCLIC)
    argv = [str(venv), str(script)]
    env = process.child_env({"PYTHONDONTWRITEBYTECODE": "1"})
    seen: list[str] = []
    for _command in range(2):
        found = Zygote(venv, env=zygote_env(), report=lambda event: seen.append(f"{event.step} {event.detail}"))
        try:
            for _ in range(2):
                ran = found.run(argv, cwd=tmp_path, env=env, timeout=60)
                assert ran is not None and ran.output == b"cyc 1\n", ran
            assert found.broken is None, found.broken
        finally:
            found.close()
    recorded = json.loads((venv.parent.parent / PRELOAD_FILE).read_text())
    assert {"cyc", "_cyc"} <= set(recorded["preload"]), recorded
    assert not [line for line in seen if "does not hold" in line], seen


def test_packages_importing_each_other_hold_across_the_list_s_batches(venv: Path) -> None:
    """A recorded list goes to the zygote 500 names at a time: _cyc first and cyc 510 names later are still
    checked as the pair they are, not as a list that does not hold."""
    site = next(venv.parent.parent.glob("lib/python*/site-packages"))
    fillers = [f"filler{i:03d}" for i in range(510)]
    for name in fillers:
        (site / f"{name}.py").write_text("")
    (venv.parent.parent / PRELOAD_FILE).write_text(json.dumps({"preload": ["_cyc", *fillers, "cyc"], "refused": []}))
    seen: list[str] = []
    found = Zygote(venv, env=zygote_env(), report=lambda event: seen.append(f"{event.step} {event.detail}"))
    try:
        assert found.broken is None, found.broken
    finally:
        found.close()
    assert not [line for line in seen if "does not hold" in line], seen
    assert any(line.startswith("warm 51") for line in seen), seen  # cyc came with _cyc, in the first batch


def test_a_package_importing_a_refused_module_is_refused_with_it_once(venv: Path) -> None:
    """aiohttp imports frozenlist's extension, refused for good: a recorded list naming aiohttp failed in every
    command (it was learned before frozenlist was refused). The first command refuses it too; the next one holds."""
    site = next(venv.parent.parent.glob("lib/python*/site-packages"))
    (site / "refusedmod.py").write_text("")
    (site / "needsrefused.py").write_text("import refusedmod\n")
    (site / "plainmod.py").write_text("")
    preload = venv.parent.parent / PRELOAD_FILE
    preload.write_text(json.dumps({"preload": ["needsrefused", "plainmod"], "refused": ["refusedmod"],
                                   "rules": LEAK_RULES}))
    said: list[list[str]] = []
    for _command in range(2):
        seen: list[str] = []
        found = Zygote(venv, env=zygote_env(),
                       report=lambda event, seen=seen: seen.append(f"{event.step} {event.detail}"))
        try:
            assert found.broken is None, found.broken
        finally:
            found.close()
        said.append(seen)
    assert any("needsrefused: it imports refusedmod, refused before" in line for line in said[0]), said[0]
    assert not [line for line in said[1] if "does not hold" in line], said[1]
    recorded = json.loads(preload.read_text())
    assert "needsrefused" in recorded["refused"] and "plainmod" in recorded["preload"], recorded


def test_a_module_that_fails_to_import_here_is_not_tried_again_after_every_run(venv: Path, tree: Path) -> None:
    """A run that puts a module in sys.modules under a name of its own (vLLM's LazyLoader does: xgrammar as "xgr")
    reports that name; the zygote cannot import it. It used to try again after every such run (a learning round
    each time, which the next run waits for: after each of the 0002 runs of `update --furthest` on the real
    history); now once, until more modules are preloaded."""
    (venv.parent.parent / PRELOAD_FILE).unlink(missing_ok=True)
    (tree.parent / "probes" / "alias.py").write_text(
        "import sys, heavy\nsys.modules['heavy_alias'] = heavy\nprint(heavy.IMPORTS)\n")
    argv = [str(venv), str(tree.parent / "probes" / "alias.py")]
    events: list[Event] = []
    zygote = Zygote(venv, env=zygote_env(), report=events.append)
    try:
        outputs = []
        for _ in range(3):
            ran = zygote.run(argv, cwd=tree, env=_env(tree), timeout=60)
            assert ran is not None
            outputs.append((ran.returncode, ran.output))
            assert zygote.settled()
        assert outputs == [(0, b"0\n")] * 3 and zygote.runs == 3
        learned = [e.detail for e in events if e.step == "importing"]
        # the first run taught it heavy (preloaded) and heavy_alias (which fails here); the next two nothing
        assert len(learned) == 1, [(e.step, e.detail) for e in events]
    finally:
        zygote.close()
