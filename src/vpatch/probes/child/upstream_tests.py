"""Upstream's tests as vpatch runs them (probes/regression.py is its vpatch side), run by the probe venv's python by
path: ``python upstream_tests.py <control.json>``, from the tree root, with the hub offline in its environment.

pytest runs as ``python -m pytest`` would (sys.path's first entry the working folder), with a plugin that
- selects the node ids asked for among the files' tests and names the ids that match none ("missing");
- blocks the network: a name lookup or a connection beyond this machine raises NetworkBlocked at once (no
  request waits on a timeout; a retry loop's backoff is bounded by the deadline);
- gives each test file a deadline: past it, the running test is interrupted and the file's other tests not run;
- names each test that could not run here: one that needs a download (blocked, or the hub offline with nothing
  cached), a GPU, a server, or ran past its file's deadline.
The control file says {"args": [pytest's arguments], "select": [node ids], "deadline": seconds per file,
"report": where the plugin writes {"not_run": {node id: need}, "missing": [node ids]}}.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Generator, Iterable
from types import FrameType, TracebackType
from typing import Any

import pytest

DOWNLOAD, GPU, SERVER, DEADLINE = "download", "gpu", "server", "deadline"
# Errors the hub's clients raise offline with nothing cached (huggingface_hub's; transformers wraps them as their
# cause), matched by class name: this module imports neither.
OFFLINE_ERRORS = frozenset({"OfflineModeIsEnabled", "LocalEntryNotFoundError"})
# What the hub's clients and vLLM say when a model or file is neither cached nor downloadable, where they raise an
# error of their own without the hub's as its cause (vLLM's ModelConfig turns a missing config into a ValueError).
NOT_CACHED = ("Invalid repository ID or local directory specified", "is not a local folder and is not a valid model "
              "identifier", "We couldn't connect to 'https://huggingface.co'", "offline mode is enabled",
              "Cannot find the requested files in the disk cache")
# What torch and vLLM say when a test asks for an accelerator that is not there.
NO_GPU = ("Torch not compiled with CUDA enabled", "Found no NVIDIA driver", "No CUDA GPUs are available",
          "CUDA driver initialization failed", "Failed to infer device type")
# vLLM's test helper that starts a server (tests/utils.py), seen in a failed test's frames.
SERVER_HELPERS = ("RemoteOpenAIServer", "RemoteVLLMServer")


class NetworkBlocked(ConnectionError):
    """A test reached for the network. (A ConnectionError, as a network that is down raises: a BaseException would
    pass retry loops by, but breaks pytest's fixtures, which cache only an Exception; the deadline bounds the
    retries, and a name never resolves so none waits on the network.)"""


class DeadlinePassed(BaseException):
    """The test's file ran past its deadline."""


def local(host: object) -> bool:
    """Whether a name or address is this machine (a Unix socket's path is)."""
    if not isinstance(host, str) or host in ("", "localhost") or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def block_network(event: str, args: tuple[Any, ...]) -> None:
    """The audit hook: a lookup or connection beyond this machine ends there."""
    if event == "socket.getaddrinfo" and not local(args[0].decode() if isinstance(args[0], bytes) else args[0]):
        raise NetworkBlocked(f"no network here: {args[0]!r} was looked up")
    if event == "socket.connect" and isinstance(args[0], socket.socket) and args[0].family in (
            socket.AF_INET, socket.AF_INET6) and isinstance(args[1], tuple) and not local(args[1][0]):
        raise NetworkBlocked(f"no network here: a connection to {args[1][0]!r}")


def chain(exc: BaseException | None) -> Iterable[BaseException]:
    """An exception and its causes and contexts."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def need(exc: BaseException) -> str | None:
    """What a failed test needed that is not here, read from its exception: None for a plain failure."""
    for found in chain(exc):
        names = {kind.__name__ for kind in type(found).__mro__}
        if isinstance(found, DeadlinePassed):
            return DEADLINE
        if isinstance(found, NetworkBlocked) or names & OFFLINE_ERRORS or any(text in str(found) for text in NOT_CACHED):
            return DOWNLOAD
        if any(text in str(found) for text in NO_GPU):
            return GPU
        tb: TracebackType | None = found.__traceback__
        while tb is not None:
            if any(helper in tb.tb_frame.f_code.co_qualname for helper in SERVER_HELPERS):
                return SERVER
            tb = tb.tb_next
    return None


class Plugin:
    def __init__(self, select: list[str], deadline: float) -> None:
        self.select = select
        self.deadline = deadline
        self.not_run: dict[str, str] = {}
        self.missing: list[str] = []
        self.started: dict[str, float] = {}  # a test file -> when its first test started

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if not self.select:
            return
        def chosen(nodeid: str, wanted: str) -> bool:
            return nodeid == wanted or nodeid.startswith((wanted + "::", wanted + "["))
        kept = [item for item in items if any(chosen(item.nodeid, wanted) for wanted in self.select)]
        self.missing = [wanted for wanted in self.select if not any(chosen(i.nodeid, wanted) for i in items)]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, None]:
        started = self.started.setdefault(item.path.as_posix(), time.monotonic())
        left = self.deadline - (time.monotonic() - started)
        if left <= 0:
            self.not_run[item.nodeid] = DEADLINE
            item.add_marker(pytest.mark.skip(reason=f"not run here: its file ran past its {self.deadline:g}s"))
        else:
            signal.setitimer(signal.ITIMER_REAL, left)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
        outcome = yield
        report: pytest.TestReport = outcome.get_result()
        if report.failed and call.excinfo is not None:
            found = need(call.excinfo.value)
            if found is not None:
                self.not_run.setdefault(item.nodeid, found)


def deadline_passed(signum: int, frame: FrameType | None) -> None:
    raise DeadlinePassed("the test's file ran past its deadline")


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as file:
        control = json.load(file)
    sys.path[0] = os.getcwd()  # as `python -m pytest` has it: this folder is no test's
    sys.addaudithook(block_network)
    signal.signal(signal.SIGALRM, deadline_passed)
    plugin = Plugin([str(s) for s in control["select"]], float(control["deadline"]))
    try:
        code = int(pytest.main([str(a) for a in control["args"]], plugins=[plugin]))
    finally:
        with open(control["report"], "w", encoding="utf-8") as file:
            json.dump({"not_run": plugin.not_run, "missing": plugin.missing}, file)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
