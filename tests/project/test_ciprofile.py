"""The run's profile (tests/helpers/ciprofile.py): seconds per module summed over every phase, kept for scripts/ci-profile."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import ciprofile
from helpers.serverimage import RUN_ENV

from vpatch.docker import Docker, DockerError
from vpatch.serve.render import health_command

TESTS = Path(__file__).resolve().parents[1]
SCRIPT = TESTS.parent / "scripts" / "ci-profile"


def test_seconds_per_module_and_the_server_start_line_are_printed_and_kept(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from helpers import ciprofile\n\ndef pytest_configure(config):\n    ciprofile.register(config)\n")
    (tmp_path / "test_slow.py").write_text(
        "import time, pytest\n\n@pytest.fixture(scope='module')\ndef server():\n    time.sleep(0.6)\n\n"
        "def test_a(server):\n    time.sleep(0.3)\n\ndef test_b(server):\n    pass\n")
    (tmp_path / "test_fast.py").write_text("def test_c():\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "time per test module" in done.stdout and "real vLLM server starts: " in done.stdout, done.stdout
    data = json.loads((tmp_path / ".pytest_cache" / "v" / "vpatch" / "ci-profile").read_text())
    rows = {row["module"]: row for row in data["modules"]}
    assert list(rows) == ["test_slow.py", "test_fast.py"]  # slowest first
    assert rows["test_slow.py"]["tests"] == 2 and rows["test_fast.py"]["tests"] == 1
    assert rows["test_slow.py"]["seconds"] >= 0.9  # the module fixture's setup counts with its module
    # the script reads the profile where pytest's cache keeps it
    shown = subprocess.run([sys.executable, str(SCRIPT), "--cache", str(tmp_path / ".pytest_cache")],
                           capture_output=True, text=True)
    assert shown.returncode == 0 and "test_slow.py" in shown.stdout and "2 tests" in shown.stdout, shown.stdout + shown.stderr
    # a reader gone before it writes (`scripts/ci-profile | head`): it ends by the signal, with no traceback
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        cut = subprocess.run([sys.executable, str(SCRIPT), "--cache", str(tmp_path / ".pytest_cache")],
                             stdout=write_end, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write_end)
    assert cut.returncode == -signal.SIGPIPE and cut.stderr == "", (cut.returncode, cut.stderr)


@pytest.mark.parametrize("how", [[], ["--collect-only"]], ids=["tests-ran", "collect-only"])
def test_the_events_watcher_ends_with_the_run_even_when_nothing_ran(tmp_path: Path, docker: Docker,
                                                                    how: list[str]) -> None:
    """The profile follows docker's events from the session's start; a run that ran nothing (--collect-only, as
    tests/project/test_markers.py runs it) left that `docker events` behind, one per such run, for good."""
    (tmp_path / "conftest.py").write_text(
        "import pytest\nfrom helpers import ciprofile\n\ndef pytest_configure(config):\n    ciprofile.register(config)\n\n"
        "@pytest.hookimpl(trylast=True)\ndef pytest_sessionstart(session):\n"
        "    watcher = session.config.pluginmanager.get_plugin('vpatch-ci-profile').watcher\n"
        "    open('watcher.pid', 'w').write(str(watcher.pid))\n")
    (tmp_path / "test_fast.py").write_text("def test_c():\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", *how, str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout + done.stderr
    pid = int((tmp_path / "watcher.pid").read_text())  # the run did start one
    try:
        left = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        left = []
    assert left[:2] != [b"docker", b"events"], f"pid {pid} still runs: {left}"


@pytest.fixture
def docker() -> Docker:
    try:
        return Docker.connect()
    except DockerError as exc:
        if os.environ.get("CI") or shutil.which("dockerd"):
            raise  # CI starts the daemon (.ci/run)
        pytest.skip(f"no docker here ({exc.message}); scripts/start-dockerd installs and starts it")


# --- the real vLLM server starts: each put down to one module, and two loading at once fail the run -------------

TOKEN = "a1b2c3"
PROBE = "exec_start: /bin/sh -c " + health_command(20001)  # what docker names a vpatch health probe's exec


def event(action: str, at: float, name: str, cid: str = "c1", **attributes: str) -> dict[str, Any]:
    """One line of `docker events --format '{{json .}}'`, as the shared daemon writes it (seen in a real run)."""
    return {"Action": action, "timeNano": int(at * 1e9), "Actor": {"ID": cid, "Attributes": {
        "name": name, ciprofile.SERVER_LABEL: "c4f8c1853cb1", ciprofile.RENDERED_LABEL: "{}", **attributes}}}


def probe(at: float, name: str, cid: str, exit_code: str, exec_id: str) -> list[dict[str, Any]]:
    return [event(PROBE, at, name, cid, execID=exec_id), event("exec_die", at + 2, name, cid, execID=exec_id,
                                                                  exitCode=exit_code)]


def test_a_server_loads_until_its_last_failed_health_probe_and_two_loading_at_once_are_found() -> None:
    a, b, c = (f"vpatch-deploy-test-{TOKEN}-gw{w}-{x}" for w, x in ((0, "aaaaaa"), (0, "bbbbbb"), (1, "cccccc")))
    events = [
        event("start", 100, a, "A"),
        *probe(110, a, "A", "1", "p1"), *probe(150, a, "A", "1", "p2"),  # still loading at 150
        event("exec_start: kill -STOP 1", 156, a, "A", execID="x"),  # a test's own exec fails: no probe of vpatch's
        event("exec_die", 157, a, "A", execID="x", exitCode="1"),
        *probe(160, a, "A", "0", "p3"), event("health_status: healthy", 162, a, "A"),
        # started after A's last failed probe, before docker saw A healthy: A may have answered already
        event("start", 155, b, "B"), event("die", 170, b, "B"),
        # another run's server (another token) and a container vpatch did not render are not this run's
        event("start", 120, "vpatch-deploy-test-ffffff-gw1-dddddd", "D"),
        {**event("start", 120, "quirky_name", "E"), "Actor": {"ID": "E", "Attributes": {"name": "quirky_name"}}},
        # A parked (renamed), then started again by a rollback while C loads on the other worker
        event("die", 200, f"{a}-parked-20261204-170000", "A"),
        event("start", 205, c, "C"),
        event("start", 210, f"{a}-parked-20261204-170000", "A"),
    ]
    found = ciprofile.servers(events, TOKEN)
    assert [(s.container, s.worker, s.start) for s in found] == [
        (a, "gw0", 100), (b, "gw0", 155), (c, "gw1", 205), (f"{a}-parked-20261204-170000", "gw0", 210)]
    first = found[0]
    assert (first.loading_until, first.healthy, first.stopped) == (150, 162, 200)
    assert found[1].loading_until == 170  # never healthy: loading until it died
    assert found[2].loading_until == float("inf")  # still loading when the run ended
    assert [(x.container, y.container) for x, y in ciprofile.loaded_at_once(found)] == [
        (c, f"{a}-parked-20261204-170000")]
    assert ciprofile.most_running_at_once(found) == 2


# Two modules, each starting a stand-in server container named as the server tests name theirs; under `--dist
# loadfile` the two workers start them at once, in one xdist group one after the other.
_SERVER_TEST = '''
import subprocess, time
import pytest
from helpers.serverimage import unique_name

{mark}
def test_start(image):
    name = unique_name("vpatch-deploy-test")
    subprocess.run(["docker", "run", "-d", "--name", name, "--label", "io.vpatch.test.key=profile-test",
                    "--label", "io.vpatch.serve.definition={{}}", image], check=True, capture_output=True)
    try:
        time.sleep(6)  # "loading": it never answers a health probe
    finally:
        subprocess.run(["docker", "rm", "-f", name], check=True, capture_output=True)
'''


def test_the_run_fails_when_two_servers_load_at_once_and_names_each_starts_one_module(tmp_path: Path,
                                                                                      docker: Docker) -> None:
    """Real containers on the shared daemon, real `docker events`, a real two-worker run. The containers are the
    stand-in server (tests/helpers/placeholder.py, a binary that waits), not vLLM: two real servers would cost
    two minutes of both cores to prove what the stand-in proves."""
    from helpers import placeholder

    image = placeholder.build(docker)
    try:
        results = {}
        for dist, mark in (("loadfile", ""), ("loadgroup", "@pytest.mark.xdist_group('servers')")):
            run = tmp_path / dist
            run.mkdir()
            (run / "conftest.py").write_text(
                "import pytest\nfrom helpers import ciprofile\n\ndef pytest_configure(config):\n"
                f"    ciprofile.register(config)\n\n@pytest.fixture\ndef image():\n    return {image!r}\n")
            for module in ("test_one.py", "test_two.py"):
                (run / module).write_text(_SERVER_TEST.format(mark=mark))
            env = {**os.environ, "PYTHONPATH": str(TESTS)}
            env.pop("PYTEST_XDIST_WORKER", None)  # this test may itself run on a worker
            env.pop(RUN_ENV, None)  # the inner run is a run of its own, with its own token
            results[dist] = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", dist, str(run)], cwd=run,
                capture_output=True, text=True, env=env, timeout=300)
    finally:
        docker.remove_image(image)
    at_once, grouped = results["loadfile"], results["loadgroup"]
    assert at_once.returncode == 1 and "2 passed" in at_once.stdout, at_once.stdout + at_once.stderr
    assert "real vLLM server starts: 2 (" in at_once.stdout and "loading at once: 1;" in at_once.stdout, at_once.stdout
    assert "FAILED: two real vLLM servers loaded at once: vpatch-deploy-test-" in at_once.stdout, at_once.stdout
    data = json.loads((tmp_path / "loadfile" / ".pytest_cache" / "v" / "vpatch" / "ci-profile").read_text())
    # each start put down to the one module its own worker ran, never "test_one.py | test_two.py"
    assert sorted(s["module"] for s in data["server_starts"]) == ["test_one.py", "test_two.py"], data
    assert {s["worker"] for s in data["server_starts"]} == {"gw0", "gw1"}, data
    assert len(data["servers_loading_at_once"]) == 1 and data["most_servers_running_at_once"] == 2, data
    assert grouped.returncode == 0, grouped.stdout + grouped.stderr
    assert "real vLLM server starts: 2 (" in grouped.stdout and "loading at once: never;" in grouped.stdout, grouped.stdout
