"""What started a run ends it whole: the one wait-and-kill loop of the zygote's keepers and the runner's supervisor.

The keeper of a run is the subreaper of what the run starts, so every process below it (reparented to it when
their parents end, daemons in sessions of their own included) is found under it in /proc and killed when the run
ends, when it is asked to end (SIGTERM: a timeout, a cancel) or when its parent ends (vpatch, or the zygote).
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable
from typing import NoReturn

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
LOST_PARENT = 137  # the keeper's parent ended before the keeper could ask to end with it
_libc = ctypes.CDLL(None, use_errno=True)


def prctl(option: int, value: int) -> None:
    _libc.prctl(option, value)


def descendants() -> set[int]:
    """Every process below this one."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found: set[int] = set()
    frontier = {os.getpid()}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier and p not in found}
        found |= frontier
    return found


def end_all() -> None:
    """Kill everything this keeper's run started, daemons and new sessions included (they were reparented here)."""
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


def _ended(signum: int, frame: object) -> NoReturn:
    end_all()
    os._exit(128 + signal.SIGTERM)


def keep(parent: int, release: Callable[[], None] = lambda: None) -> None:
    """Make this process the keeper of one run and fork it: returns in the child, which becomes the run (no group
    or session leader, so that its setsid works as in a fresh process). The keeper, once `release` has closed its
    copies of what only the run may hold, waits for the run, ends everything it started and exits as it did: its
    code, or the signal that ended it. It ends the same way at SIGTERM and when `parent` ends."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGTERM, _ended)
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it ended before the line above: nothing would end this keeper
        os._exit(LOST_PARENT)
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        return
    release()
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
