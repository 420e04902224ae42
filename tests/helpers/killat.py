"""kill -9 at a named step of `vpatch update`, done from the test side: vpatch itself has no kill hook.

`python killat.py STEP VPATCH-ARGS...` runs vpatch's CLI in this process after wrapping the function the
update calls at STEP, so that the process SIGKILLs itself there, as a power cut or `kill -9` would.
`python killat.py --trace LOG VPATCH-ARGS...` kills nothing and appends each step it passes to LOG: the
test of this helper checks that an update passes every step once, in order, so a step that moved away
from its function fails there instead of silently killing somewhere else.
"""

from __future__ import annotations

import functools
import importlib
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Each step of an update, in the order an update reaches it: (module, function, "before" its call or
# "after" it returned). The function is looked up where the update calls it, at call time.
STEPS: dict[str, tuple[str, str, str]] = {
    "resolved": ("vpatch.update", "judge_with_status", "before"),  # target resolved, series loaded; nothing judged
    "judged": ("vpatch.update.run", "dispose", "after"),  # every patch has its disposition
    "applied": ("vpatch.update.run", "apply_series", "after"),  # the update tree holds the patches that apply plainly
    "validated": ("vpatch.update.run", "export_series", "before"),  # their probes are validated on the new pin
    "exported": ("vpatch.update.run", "export_series", "after"),  # the refreshed patch files exist, in memory only
    "prepared": ("vpatch.git", "tree_with", "after"),  # the project's new tree is in git's objects
    "committed": ("vpatch.git", "update_refs", "after"),  # the commit point: the branch has moved
}
HERE = Path(__file__)


def at(step: str, action: Callable[[], None]) -> None:
    """Make `action` run at `step` of every update this process runs."""
    module_name, name, when = STEPS[step]
    module = importlib.import_module(module_name)
    real = getattr(module, name)  # an AttributeError here: the update no longer calls it; update STEPS

    @functools.wraps(real)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if when == "before":
            action()
        result = real(*args, **kwargs)
        if when == "after":
            action()
        return result

    setattr(module, name, wrapper)


def kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    if argv[0] == "--trace":
        log, args = Path(argv[1]), argv[2:]
        for step in STEPS:
            at(step, functools.partial(_append, log, step))
    else:
        step, args = argv[0], argv[1:]
        at(step, kill)
    from vpatch.commands.cli import main as vpatch

    sys.argv = ["vpatch", *args]
    vpatch()


def _append(log: Path, step: str) -> None:
    with log.open("a") as fh:
        fh.write(step + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
