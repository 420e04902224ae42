"""Where a test run's time goes: seconds per test module and the real vLLM server starts, printed at the end of
every run and kept in pytest's cache (`scripts/ci-profile` prints them again, in full).

A server start is a `start` event of the shared docker daemon for a container of the vLLM CPU test server image
(or an image built on it: its label io.vpatch.test.key) that vpatch rendered from a serve: section (the label
io.vpatch.serve.definition): `vpatch serve`, a deploy's candidate, a rollback starting the parked production
again, `verify --live`. Containers of that image that only run a command (the lint's flag dump, `vllm serve
serve`) are counted apart. Not seen: a private daemon's containers (test_deploy_daemon_restart.py), and
containers whose name lacks this run's token (serverimage.unique_name): another run's on the shared daemon.

Each start is put down to the one module its worker (named in the container's name, serverimage.unique_name) ran
then. The docs promise that two servers never load at once (every real-server test in one xdist group, on one
worker): the profile checks it and fails the run when two did. A server loads from its start until it answers;
docker's events tell that to within one health probe: the server surely still loaded at the start of the last of
vpatch's health probes that failed before the first that passed (or until it died). Servers that merely run at
once (the session's idle production beside a candidate on the bare host) are counted, not failed.

Under xdist the controller does all of it: the workers' reports carry each phase's worker, duration and times.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from vpatch.serve.render import health_source

CACHE_KEY = "vpatch/ci-profile"
SERVER_LABEL = "io.vpatch.test.key"  # on the test server image (scripts/build-test-server-image) and all built on it
RENDERED_LABEL = "io.vpatch.serve.definition"  # on every container vpatch's serve renders


@dataclass
class Phase:
    module: str
    worker: str  # "gw0", "gw1", ...; "main" without xdist
    start: float
    stop: float


@dataclass
class Server:
    """One start of one of this run's server containers, from docker's events (times in seconds since the epoch)."""

    container: str  # its name at the start
    worker: str
    start: float
    loading_until: float  # surely still loading until then (see the module docstring)
    stopped: float | None = None  # None: still running when the run ended
    healthy: float | None = None

    def runs_at(self, at: float) -> bool:
        return self.start <= at and (self.stopped is None or at < self.stopped)


def servers(events: Iterable[dict[str, Any]], token: str) -> list[Server]:
    """The starts of this run's servers (the containers vpatch rendered whose name holds `token`), in order."""
    found: list[Server] = []
    open_by_id: dict[str, Server] = {}
    probes: dict[str, float] = {}  # execID of a running health probe of vpatch's -> its start
    failed_probe: dict[str, float] = {}  # container id -> the start of its last failed probe while it loaded
    for event in sorted(events, key=lambda e: int(e["timeNano"])):
        attributes = event.get("Actor", {}).get("Attributes", {})
        name = attributes.get("name", "")
        if RENDERED_LABEL not in attributes or f"-{token}-" not in name:
            continue
        cid, action, at = event.get("Actor", {}).get("ID", ""), event.get("Action", ""), int(event["timeNano"]) / 1e9
        current = open_by_id.get(cid)
        if action == "start":
            if current is not None and current.stopped is None:
                current.stopped = at  # a start without its die (not seen): the earlier run ended by then
            current = open_by_id[cid] = Server(name, _worker_of(name, token), at, at)
            found.append(current)
            failed_probe.pop(cid, None)
        elif current is None:
            continue
        elif action.startswith("exec_start: "):
            command = action.removeprefix("exec_start: ").removeprefix("/bin/sh -c ")
            if health_source(command) is not None:
                probes[attributes.get("execID", "")] = at
        elif action == "exec_die":
            begun = probes.pop(attributes.get("execID", ""), None)
            if begun is not None and attributes.get("exitCode") != "0" and current.healthy is None:
                failed_probe[cid] = begun
        elif action.startswith("health_status: healthy") and current.healthy is None:
            current.healthy = at
            current.loading_until = max(current.start, failed_probe.get(cid, current.start))
        elif action == "die" and current.stopped is None:
            current.stopped = at
            if current.healthy is None:
                current.loading_until = at
    for server in found:
        if server.healthy is None and server.stopped is None:
            server.loading_until = float("inf")  # never answered while the run lasted
    return found


def loaded_at_once(found: list[Server]) -> list[tuple[Server, Server]]:
    """Pairs of servers of which the later started while the earlier surely still loaded."""
    return [(a, b) for i, a in enumerate(found) for b in found[i + 1:] if a.start <= b.start < a.loading_until]


def most_running_at_once(found: list[Server]) -> int:
    return max((sum(1 for other in found if other.runs_at(s.start)) for s in found), default=0)


def _worker_of(name: str, token: str) -> str:
    """The worker in a name from serverimage.unique_name, "{prefix}-{token}-{worker}-{random}"."""
    return name.split(f"-{token}-", 1)[1].split("-", 1)[0]


@dataclass
class Profile:
    began: float = field(default_factory=time.time)
    token: str = ""
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    tests: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    phases: list[Phase] = field(default_factory=list)
    # `docker events` follows the daemon from the session's start: asked only at the end, the daemon answers
    # from the last 256 events it keeps, and a run's health checks alone make more than that.
    events: Any = None
    watcher: subprocess.Popen[bytes] | None = None

    starts: list[dict[str, Any]] | None = None  # None: not counted (no docker daemon answered)
    others: int = 0
    overlaps: list[tuple[Server, Server]] = field(default_factory=list)
    running_at_once: int = 0

    @pytest.hookimpl
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if shutil.which("docker") is None:
            return
        self.events = tempfile.TemporaryFile()
        # starts, deaths, health status changes and health probes (execs) of every container of the server image
        self.watcher = subprocess.Popen(
            ["docker", "events", "--since", f"{self.began:.3f}", "--filter", "type=container", "--filter", "event=start",
             "--filter", "event=die", "--filter", "event=health_status", "--filter", "event=exec_start",
             "--filter", "event=exec_die", "--filter", f"label={SERVER_LABEL}", "--format", "{{json .}}"],
            stdout=self.events, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::", 1)[0]
        self.seconds[module] += report.duration
        if report.when == "call" or (report.when == "setup" and report.skipped):
            self.tests[module] += 1
        node = getattr(report, "node", None)  # under xdist, the controller's handle of the worker that ran it
        self.phases.append(Phase(module, node.gateway.id if node is not None else "main", report.start, report.stop))

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Count the servers before the summary is printed, and fail the run when two loaded at once."""
        if not self.phases:  # nothing ran (--collect-only, an error at collection)
            self._stop_watching()  # left running, it outlived the run
            return
        found = self._servers()
        if found is None:
            return
        self.starts = [{"at": round(s.start - self.began, 1), "container": s.container, "worker": s.worker,
                        "module": self._module_of(s), "loading_s": _seconds(s.loading_until - s.start),
                        "ran_s": _seconds((s.stopped or time.time()) - s.start)} for s in found]
        self.overlaps = loaded_at_once(found)
        self.running_at_once = most_running_at_once(found)
        if self.overlaps and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        if not self.phases:
            return
        data = {
            "wall_s": round(time.time() - self.began, 1),
            "modules": [{"module": m, "seconds": round(s, 1), "tests": self.tests[m]}
                        for m, s in sorted(self.seconds.items(), key=lambda kv: -kv[1])],
            "server_starts": self.starts,
            "servers_loading_at_once": [[self._describe(a), self._describe(b)] for a, b in self.overlaps],
            "most_servers_running_at_once": self.running_at_once,
            "other_server_image_containers": self.others,
        }
        cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
        if cache is not None:
            cache.set(CACHE_KEY, data)
        tr = terminalreporter
        tr.write_sep("=", "time per test module (setup + call + teardown; top 15; scripts/ci-profile: all)")
        for row in data["modules"][:15]:
            tr.write_line(f"{row['seconds']:9.1f}s  {row['tests']:4d} tests  {row['module']}")
        if self.starts is None:
            tr.write_line("real vLLM server starts: not counted (no docker daemon answered)")
            return
        per_module: dict[str, int] = defaultdict(int)
        for start in self.starts:
            per_module[start["module"]] += 1
        detail = ", ".join(f"{m} {n}" for m, n in sorted(per_module.items(), key=lambda kv: -kv[1]))
        tr.write_line(f"real vLLM server starts: {len(self.starts)}" + (f" ({detail})" if detail else "")
                      + f"; loading at once: {'never' if not self.overlaps else len(self.overlaps)}; most running at "
                      f"once: {self.running_at_once}; other containers of the server image: {self.others}")
        for a, b in self.overlaps:
            tr.write_line(f"FAILED: two real vLLM servers loaded at once: {self._describe(b)} started while "
                          f"{self._describe(a)} still loaded (the docs promise one at a time: tests/conftest.py "
                          "FIXTURE_GROUPS)", red=True, bold=True)

    def _servers(self) -> list[Server] | None:
        """This run's server starts from the shared daemon's events since the session began; None without a daemon."""
        if self.watcher is None:
            return None
        time.sleep(1)  # the last events on their way through the pipe
        self._stop_watching()
        self.events.seek(0)
        text = self.events.read().decode()
        if not text and shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode:
            return None
        events = [json.loads(line) for line in text.splitlines()]
        # their names are docker's own: any run's on the shared daemon
        self.others = sum(1 for e in events if e.get("Action") == "start"
                          and RENDERED_LABEL not in e.get("Actor", {}).get("Attributes", {}))
        return servers(events, self.token)

    def _stop_watching(self) -> None:
        if self.watcher is not None:
            self.watcher.terminate()
            self.watcher.wait(timeout=30)
            self.watcher = None

    def _module_of(self, server: Server) -> str:
        """The module the server's worker ran when it started (its setup, call or teardown)."""
        modules = {p.module for p in self.phases if p.worker == server.worker and p.start <= server.start <= p.stop}
        return " | ".join(sorted(modules)) or "(between tests)"

    def _describe(self, server: Server) -> str:
        return (f"{server.container} ({self._module_of(server)}, {server.worker}, started at "
                f"{server.start - self.began:.0f} s)")


def _seconds(value: float) -> float | None:
    return None if value == float("inf") else round(value, 1)


def register(config: pytest.Config) -> None:
    from helpers.serverimage import run_token

    if not hasattr(config, "workerinput"):  # an xdist worker: its controller profiles the whole run
        config.pluginmanager.register(Profile(token=run_token()), "vpatch-ci-profile")
