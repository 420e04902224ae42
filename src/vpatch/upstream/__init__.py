"""Where upstream vLLM is read from: a bare git mirror or the release history built from PyPI.

Other rooms import these names from here; modules inside the room import each other directly."""

from vpatch.upstream.hunkmoves import HunkMove
from vpatch.upstream.moves import Move
from vpatch.upstream.prefetch import prefetch_for_status
from vpatch.upstream.source import history_path, open_upstream, pin_commit, pin_moved, resolve

__all__ = [
    "HunkMove",
    "Move",
    "history_path",
    "open_upstream",
    "pin_commit",
    "pin_moved",
    "prefetch_for_status",
    "resolve",
]
