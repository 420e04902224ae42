"""What every room may use: errors with hints, atomic writes, progress events, journals, the host's folders,
the locks between vpatch processes and the one process runner.

Other rooms import these names from here; modules inside the room import each other directly."""

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
from vpatch.base.paths import cache_dir, state_dir
from vpatch.base.process import Output, interruptible
from vpatch.base.progress import Event, Progress, Reporter, silent

__all__ = [
    "ApplyError",
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
    "exclusive",
    "exit_code_help",
    "host_lock_folder",
    "host_resources",
    "interruptible",
    "silent",
    "state_dir",
]
