"""The parent of a fresh probe run: ``python -E -s -S supervisor.py <vpatch pid> <probe argv...>``.

It keeps the run (reaper.keep): the probe is exec'd unchanged (its argv, cwd, environment), everything it starts
ends with it, and so does the run when vpatch ends, even by SIGKILL; its exit status is the probe's.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vpatch.probes.child import reaper
else:
    import reaper  # run by path: this folder is sys.path's first entry


def main(argv: list[str]) -> None:
    reaper.keep(int(argv[1]))
    try:
        os.execv(argv[2], argv[2:])
    except OSError as exc:
        print(f"cannot run {argv[2]}: {exc}", flush=True)
        os._exit(127)


if __name__ == "__main__":
    main(sys.argv)
