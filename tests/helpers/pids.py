"""Whether a process has ended, read from /proc (a zombie counts as ended: it runs nothing)."""

from __future__ import annotations

import time
from pathlib import Path


def gone(pid: int, *, within: float) -> bool:
    """True once `pid` is gone or a zombie, waiting up to `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False
