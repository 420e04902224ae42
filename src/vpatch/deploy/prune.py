"""`vpatch deploy NAME --prune`: remove the parked and rolled-back candidate containers deploys leave behind,
never the one `--rollback` would bring back, never a running one."""

from __future__ import annotations

import re
from dataclasses import dataclass

from vpatch.base import VpatchError
from vpatch.deploy.container import held
from vpatch.deploy.journal import Journal
from vpatch.docker import Docker
from vpatch.serve import LABEL_DEFINITION

# <production name>-parked-YYYYmmdd-HHMMSS / -candidate-YYYYmmdd-HHMMSS, as park and the rollback name them.
_LEFT = re.compile(r"^(?P<prod>.+)-(?P<kind>parked|candidate)-(?P<stamp>\d{8}-\d{6})$")


@dataclass(frozen=True)
class Pruned:
    removed: tuple[str, ...]
    kept: tuple[tuple[str, str], ...]  # (name, why it stays)


def prune_containers(docker: Docker, definition: str, *, keep: int) -> Pruned:
    """Remove all but the `keep` newest parked and the `keep` newest candidate containers of `definition`."""
    first = Journal.load(definition)
    if first is None:
        raise VpatchError(f"no deploy of {definition} is recorded on this host; nothing to prune",
                          hint="prune removes what deploys left behind, named after the journal's production container")
    with held(first.container, first.port, f"vpatch deploy {definition} --prune"):
        return _prune(docker, definition, keep=keep)


def _prune(docker: Docker, definition: str, *, keep: int) -> Pruned:
    journal = Journal.load(definition)
    if journal is None:
        raise VpatchError(f"no deploy of {definition} is recorded on this host; nothing to prune",
                          hint="prune removes what deploys left behind, named after the journal's production container")
    if not journal.phase.settled:
        raise VpatchError(f"a deploy of {definition} did not finish (phase {journal.phase.value}); nothing pruned",
                          hint=f"`vpatch deploy {definition} --rollback` first; --status shows where things are")
    protected = journal.parked_id
    removed: list[str] = []
    kept: list[tuple[str, str]] = []
    left = []
    for info in docker.containers(label=f"{LABEL_DEFINITION}={definition}"):
        match = _LEFT.match(info.name)
        # Only this production container's leftovers: the label alone also marks other hosts' projects that
        # share the daemon under the same definition name (seen: a test's prune took another run's candidates).
        if match is None or match["prod"] != journal.container:
            continue
        if info.id == protected:
            kept.append((info.name, "`--rollback` brings it back"))
        elif info.status in ("running", "restarting", "paused"):
            kept.append((info.name, f"it is {info.status}"))
        else:
            left.append((match["kind"], match["stamp"], info))
    for kind in ("parked", "candidate"):
        of_kind = sorted((x for x in left if x[0] == kind), key=lambda x: x[1], reverse=True)
        for n, (_kind, _stamp, info) in enumerate(of_kind):
            if n < keep:
                kept.append((info.name, f"one of the {keep} newest {kind}"))
            else:
                docker.remove_container(info.id)
                removed.append(info.name)
    return Pruned(tuple(removed), tuple(kept))
