"""What every room may use: errors with hints, atomic writes, progress events, journals, the host's folders,
the locks between vpatch processes and the one process runner.

Other rooms import these names from here; modules inside the room import each other directly. The process
runner's functions carry names that say they start a process (`run` alone would be everyone's)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from vpatch.base.errors import (
    ApplyError,
    ConfigError,
    ExitCode,
    GitError,
    JournalError,
    ProcessError,
    SeriesError,
    UpstreamError,
    VpatchError,
    exit_code_help,
)
from vpatch.base.fs import atomic_write
from vpatch.base.lock import exclusive, host_lock_folder, host_resources
from vpatch.base.paths import cache_dir, host_state, state_dir
from vpatch.base.process import TAIL_CHARS as PROCESS_TAIL_CHARS
from vpatch.base.process import Child as ChildProcess
from vpatch.base.process import Output, child_env, interruptible
from vpatch.base.process import failure as process_failure
from vpatch.base.process import feed as feed_process
from vpatch.base.process import run as run_process
from vpatch.base.process import stream as stream_process
from vpatch.base.progress import Event, Progress, Reporter, silent


# Defined here, not in a module of its own: every command loads this face, and the helper is nine lines.
def lazy_exports(face: dict[str, Any], table: Mapping[str, tuple[str, str]]) -> Callable[[str], object]:
    """The module `__getattr__` of the face whose globals are `face`: a name in `table` (name -> (module, name
    there)) imports its module when first asked for and is kept in the face, so the next use finds it there."""

    def load(name: str) -> object:
        if name not in table:
            raise AttributeError(f"module {face['__name__']!r} has no attribute {name!r}")
        module, attribute = table[name]
        face[name] = value = getattr(importlib.import_module(module), attribute)
        return value

    return load


if TYPE_CHECKING:
    from vpatch.base.records import json_kind, json_shown
    from vpatch.base.records import load as load_record
    from vpatch.base.records import save as save_record

# name -> (module, name there): loaded on first use (PEP 562). A journal's typed record (one JSON file, written
# atomically, read back with errors naming the file) brings the json package, which `vpatch --help` does not need.
_LAZY: dict[str, tuple[str, str]] = {
    "json_kind": ("vpatch.base.records", "json_kind"),
    "json_shown": ("vpatch.base.records", "json_shown"),
    "load_record": ("vpatch.base.records", "load"),
    "save_record": ("vpatch.base.records", "save"),
}

if not TYPE_CHECKING:  # mypy reads the names from the imports above, not from a catch-all
    __getattr__ = lazy_exports(globals(), _LAZY)

__all__ = [
    "PROCESS_TAIL_CHARS",
    "ApplyError",
    "ChildProcess",
    "ConfigError",
    "Event",
    "ExitCode",
    "GitError",
    "JournalError",
    "Output",
    "ProcessError",
    "Progress",
    "Reporter",
    "SeriesError",
    "UpstreamError",
    "VpatchError",
    "atomic_write",
    "cache_dir",
    "child_env",
    "exclusive",
    "exit_code_help",
    "feed_process",
    "host_lock_folder",
    "host_resources",
    "host_state",
    "interruptible",
    "json_kind",
    "json_shown",
    "lazy_exports",
    "load_record",
    "process_failure",
    "run_process",
    "save_record",
    "silent",
    "state_dir",
    "stream_process",
]
