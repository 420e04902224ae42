"""Where a test run's time goes: seconds per test module and the real vLLM server starts, printed at the end of
every run and kept in pytest's cache (`scripts/ci-profile` prints them again, in full).

A server start is a `start` event of the shared docker daemon for a container of the vLLM CPU test server image
(or an image built on it: its label io.vpatch.test.key) that vpatch rendered from a serve: section (the label
io.vpatch.serve.definition): `vpatch serve`, a deploy's candidate, a rollback starting the parked production
again, `verify --live`. Containers of that image that only run a command (the lint's flag dump, `vllm serve
serve`) are counted apart. Not seen: a private daemon's containers (test_deploy_daemon_restart.py), and
containers whose name lacks this run's token (serverimage.unique_name): another run's on the shared daemon.

Under xdist the controller does all of it: the workers' reports carry each phase's duration and times.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest

CACHE_KEY = "vpatch/ci-profile"
SERVER_LABEL = "io.vpatch.test.key"  # on the test server image (scripts/build-test-server-image) and all built on it
RENDERED_LABEL = "io.vpatch.serve.definition"  # on every container vpatch's serve renders


@dataclass
class Phase:
    module: str
    start: float
    stop: float


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

    @pytest.hookimpl
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if shutil.which("docker") is None:
            return
        self.events = tempfile.TemporaryFile()
        self.watcher = subprocess.Popen(
            ["docker", "events", "--since", f"{self.began:.3f}", "--filter", "type=container", "--filter", "event=start",
             "--filter", f"label={SERVER_LABEL}", "--format", "{{json .}}"],
            stdout=self.events, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::", 1)[0]
        self.seconds[module] += report.duration
        if report.when == "call" or (report.when == "setup" and report.skipped):
            self.tests[module] += 1
        self.phases.append(Phase(module, report.start, report.stop))

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        if not self.phases:  # nothing ran (--collect-only, an error at collection)
            return
        starts, others = self._server_starts()
        data = {
            "wall_s": round(time.time() - self.began, 1),
            "modules": [{"module": m, "seconds": round(s, 1), "tests": self.tests[m]}
                        for m, s in sorted(self.seconds.items(), key=lambda kv: -kv[1])],
            "server_starts": starts,
            "other_server_image_containers": others,
        }
        cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
        if cache is not None:
            cache.set(CACHE_KEY, data)
        tr = terminalreporter
        tr.write_sep("=", "time per test module (setup + call + teardown; top 15; scripts/ci-profile: all)")
        for row in data["modules"][:15]:
            tr.write_line(f"{row['seconds']:9.1f}s  {row['tests']:4d} tests  {row['module']}")
        if starts is None:
            tr.write_line("real vLLM server starts: not counted (no docker daemon answered)")
        else:
            per_module: dict[str, int] = defaultdict(int)
            for start in starts:
                per_module[start["module"]] += 1
            detail = ", ".join(f"{m} {n}" for m, n in sorted(per_module.items(), key=lambda kv: -kv[1]))
            tr.write_line(f"real vLLM server starts: {len(starts)}" + (f" ({detail})" if detail else "")
                          + f"; other containers of the server image: {others}")

    def _server_starts(self) -> tuple[list[dict[str, Any]] | None, int]:
        """The shared daemon's start events since the session began, each with the module(s) running then."""
        if self.watcher is None:
            return None, 0
        time.sleep(1)  # the last start's event on its way through the pipe
        self.watcher.terminate()
        self.watcher.wait(timeout=30)
        self.events.seek(0)
        text = self.events.read().decode()
        self.watcher = None
        if not text and shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode:
            return None, 0
        starts, others = [], 0
        for line in text.splitlines():
            event = json.loads(line)
            attributes = event.get("Actor", {}).get("Attributes", {})
            if RENDERED_LABEL not in attributes:
                others += 1  # their names are docker's own: any run's on the shared daemon
                continue
            if f"-{self.token}-" not in attributes.get("name", ""):
                continue
            at = int(event["timeNano"]) / 1e9
            # Two xdist workers can run tests at that moment: both modules are named.
            modules = sorted({p.module for p in self.phases if p.start <= at <= p.stop}) or ["(between tests)"]
            starts.append({"at": round(at - self.began, 1), "container": attributes.get("name", ""),
                           "module": " | ".join(modules)})
        return starts, others


def register(config: pytest.Config) -> None:
    from helpers.serverimage import run_token

    if not hasattr(config, "workerinput"):  # an xdist worker: its controller profiles the whole run
        config.pluginmanager.register(Profile(token=run_token()), "vpatch-ci-profile")
