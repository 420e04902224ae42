"""The host's folders vpatch keeps things in: the cache (rebuildable) and the state (journals, locks)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from vpatch.base.errors import VpatchError


def cache_dir() -> Path:
    """vpatch's cache root: $VPATCH_CACHE, else $XDG_CACHE_HOME/vpatch, else ~/.cache/vpatch."""
    explicit = os.environ.get("VPATCH_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "vpatch"


# The host of a fleet (images/<name>.yaml hosts:) whose state the code in a `host_state` block keeps.
_HOST: ContextVar[str | None] = ContextVar("vpatch_state_host", default=None)


@contextmanager
def host_state(host: str | None) -> Iterator[None]:
    """For the block, state_dir() is the state of the fleet's host `host` (its journals, records, locks under
    hosts/<host>/): each host's deploy stands alone, as it would with vpatch run on that machine. None: this host."""
    token = _HOST.set(host)
    try:
        yield
    finally:
        _HOST.reset(token)


def state_dir() -> Path:
    """The host's vpatch state folder (hosts/<name>/ in it inside a `host_state` block)."""
    root = _state_root()
    host = _HOST.get()
    return root / "hosts" / host if host is not None else root


def _state_root() -> Path:
    """The host's vpatch state folder: $VPATCH_STATE, else $XDG_STATE_HOME/vpatch, else ~/.local/state/vpatch.

    A relative $VPATCH_STATE is refused: it would name another folder from each working directory, and
    `deploy --status` run from another folder said "no deploy recorded" while production stayed parked."""
    given = os.environ.get("VPATCH_STATE")
    if given:
        if not os.path.isabs(given):
            raise VpatchError(f"VPATCH_STATE must be an absolute path, not {given!r}: a relative one names another "
                              "folder from each working directory", hint=f"export VPATCH_STATE=\"$PWD/{given}\"")
        return Path(given)
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "vpatch"
