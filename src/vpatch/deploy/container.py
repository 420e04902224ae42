"""The container side of a switch: watch a start, wait until alive, park, and restore (the rollback)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NoReturn

from vpatch import serve
from vpatch.base import Progress, VpatchError, host_lock_folder, host_resources
from vpatch.deploy.journal import Journal, Phase
from vpatch.deploy.judge import CheckResult, CheckStatus
from vpatch.docker import ContainerInfo, DaemonGone, Docker
from vpatch.serve import LABEL_DEFINITION, LABEL_DEPLOY

DAEMON_WAIT_S = 300.0  # how long a rollback waits for a docker daemon that stopped answering (a restart)


class RollbackError(VpatchError):
    """Production could not be brought back to a healthy state; the journal keeps what is needed to retry."""


class NothingRestored(RollbackError):
    """There is no container to bring back: the candidate is left running, never stopped for nothing."""


def held(container: str, port: int | None, holder: str) -> AbstractContextManager[None]:
    """The locks of the container name and the port a deploy, rollback, prune or serve acts on: one of them
    at a time on this host, whatever definition names them (the kernel releases a killed holder's lock)."""
    return host_resources(host_lock_folder(), container=container, port=port, holder=holder)


class NotOurs(RollbackError):
    """A container the journal names is not the one it recorded (another id, another definition's labels)."""


def _labels(info: ContainerInfo) -> str:
    return ", ".join(f"{k}={info.labels[k]}" for k in (LABEL_DEFINITION, LABEL_DEPLOY) if k in info.labels) or "no vpatch label"


def identify(docker: Docker, journal: Journal) -> tuple[ContainerInfo | None, ContainerInfo | None]:
    """The parked production container and the candidate the journal names, each verified before anything
    acts on it: by its full id (docker also finds a container by a name that looks like an id) and by its
    labels (the definition, and for the candidate its deploy). Anything else is refused with what is there."""
    where = journal.path

    def refuse(what: str, info: ContainerInfo, why: str) -> NoReturn:
        raise NotOurs(f"the journal's {what} is not the container it recorded: {info.name} ({info.id[:12]}, "
                      f"{info.status}, {_labels(info)}) {why}; nothing was touched",
                      hint=f"look at `docker ps -a` and the journal {where}; fix or remove the journal once "
                      "production is sound (`vpatch serve NAME` starts production from its yaml)")

    parked = docker.container(journal.parked_id) if journal.parked_id else None
    if parked is not None:
        if not parked.id.startswith(journal.parked_id or ""):
            refuse("parked production", parked, f"is another container (its id is not {journal.parked_id})")
        label = parked.labels.get(LABEL_DEFINITION)
        expected = journal.parked_label if journal.parked_label is not None else label
        if label not in (None, journal.definition) or (label or "") != (expected or ""):
            refuse("parked production", parked, f"is labelled for {label!r}, not {journal.definition!r}")
        if parked.name not in (journal.parked_name, journal.container):
            refuse("parked production", parked, f"is named neither {journal.parked_name} nor {journal.container}")
    candidate = docker.container(journal.candidate_id) if journal.candidate_id else None
    if candidate is not None and not candidate.id.startswith(journal.candidate_id or ""):
        refuse("candidate", candidate, f"is another container (its id is not {journal.candidate_id})")
    if candidate is None and journal.candidate_started:
        # Killed between `docker run` and the journal write: the candidate holds the name, and its labels say so.
        holder = docker.container(journal.container)
        if holder is not None and holder.id != (parked.id if parked else None) and not (
                journal.parked_id and holder.id.startswith(journal.parked_id)):
            candidate = holder
            if holder.labels.get(LABEL_DEPLOY) != journal.started:
                refuse("candidate (the holder of the production name)", holder,
                       f"does not carry this deploy's label {LABEL_DEPLOY}={journal.started}: another run started it")
    if candidate is not None:
        if candidate.labels.get(LABEL_DEFINITION) != journal.definition:
            refuse("candidate", candidate, f"is not labelled for {journal.definition!r}")
        if LABEL_DEPLOY in candidate.labels and candidate.labels[LABEL_DEPLOY] != journal.started:
            refuse("candidate", candidate, f"belongs to the deploy {candidate.labels[LABEL_DEPLOY]}, not {journal.started}")
    holder = docker.container(journal.container)
    if holder is not None and holder.id not in {c.id for c in (parked, candidate) if c is not None}:
        refuse("production name", holder, "holds the production name and is neither this deploy's parked "
               "production nor its candidate")
    return parked, candidate


def stamp(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")


def watch_start(docker: Docker, cid: str, seconds: float) -> CheckResult:
    """'Started and not restarting': the container stays up for `seconds`; a crash loop fails within them."""
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        why = serve.why_down(docker, cid)
        if why is not None:
            return CheckResult("started", CheckStatus.FAIL, f"down after {elapsed:.0f}s", why, elapsed)
        time.sleep(0.5)
    return CheckResult("started", CheckStatus.PASS, f"running, no restart in {seconds:.0f}s", "", time.monotonic() - start)


def wait_alive(docker: Docker, cid: str, url: str, timeout: float, progress: Progress, name: str = "health", *,
               model: str | None = None, timeout_key: str = "deploy.health_timeout_s") -> CheckResult:
    """serve's wait (serve/health.py: /health and a 1-token completion from the server that serves `model`;
    an exit or a restart fails at once), as a check whose detail is the line that says why it is not alive."""
    start = time.monotonic()
    try:
        seconds = serve.wait_alive(docker, cid, url, timeout=timeout, progress=progress, model=model,
                                    timeout_key=timeout_key)
    except serve.NotAlive as exc:
        elapsed = time.monotonic() - start
        return CheckResult(name, CheckStatus.FAIL, f"not alive after {elapsed:.0f}s", exc.why, elapsed)
    return CheckResult(name, CheckStatus.PASS, f"alive after {seconds:.0f}s (a 1-token completion answered)", "", seconds)


def park(docker: Docker, journal: Journal, cid: str, restart: str) -> Journal:
    """Rename the production container (never delete it), set its restart policy to no, stop it."""
    parked = f"{journal.container}-parked-{journal.started}"
    label = (docker.container(cid) or _gone(cid)).labels.get(LABEL_DEFINITION, "")
    journal = journal.advance(Phase.PARKING, parked_id=cid, parked_name=parked, parked_restart=restart,
                              parked_label=label)
    docker.set_restart_policy(cid, "no")
    docker.rename_container(cid, parked)
    docker.stop_container(cid)
    return journal


def _gone(cid: str) -> NoReturn:
    raise VpatchError(f"the production container {cid[:12]} is gone before it was parked; nothing was switched",
                      hint="`docker ps -a` shows the containers; run the deploy again")


@contextmanager
def uninterruptible() -> Iterator[None]:
    """A rollback runs to its end: a second Ctrl-C or SIGTERM is ignored (kill -9 leaves the journal)."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass(frozen=True)
class Restored:
    """What a rollback did: where the candidate went and whether production answers again."""

    candidate_kept_as: str | None
    production: str | None  # the restored container's name; None when there was none to restore
    healthy_after_s: float | None
    journal: Journal


def restore(docker: Docker, journal: Journal, *, url: str, health_timeout: float, progress: Progress,
            automatic: bool = False, daemon_wait_s: float = DAEMON_WAIT_S) -> Restored:
    """Roll back from any phase: stop and keep the candidate, rename the parked container back, restore its
    restart policy, start it and verify it is alive. Idempotent: it reads where things are, not where they
    were, so a daemon that restarts in the middle is waited for (`daemon_wait_s`) and the rollback begins
    again. With no parked container to bring back, the candidate keeps running and NothingRestored says so;
    only an `automatic` rollback of a first deploy (nothing ran before) stops the candidate that failed."""
    with uninterruptible():
        deadline = time.monotonic() + daemon_wait_s
        while True:
            try:
                return _restore(docker, journal, url=url, health_timeout=health_timeout, progress=progress,
                                automatic=automatic)
            except DaemonGone as exc:
                if time.monotonic() > deadline:
                    raise RollbackError(f"the docker daemon did not come back within {daemon_wait_s:.0f}s: {exc.message}",
                                        hint=f"once dockerd runs, `vpatch deploy {journal.definition} --rollback` "
                                        "finishes the rollback") from exc
                progress(f"rollback: the docker daemon does not answer; waiting for it ({exc.message[:120]})")
                time.sleep(2)
                journal = Journal.load(journal.definition) or journal


def _restore(docker: Docker, journal: Journal, *, url: str, health_timeout: float, progress: Progress,
             automatic: bool) -> Restored:
    parked, candidate = identify(docker, journal)
    if parked is None and not (automatic and journal.parked_id is None):
        _nothing_to_restore(docker, journal, candidate)
    journal = journal.advance(Phase.ROLLING_BACK)
    kept = _retire_candidate(docker, journal, candidate, progress)
    journal = journal.advance(Phase.ROLLING_BACK, candidate_kept_as=kept)
    if parked is None:
        journal = journal.advance(Phase.ROLLED_BACK, note="no production container was running before the deploy")
        return Restored(kept, None, None, journal)
    if parked.name != journal.container:
        progress(f"rollback: renaming {parked.name} back to {journal.container}")
        docker.rename_container(parked.id, journal.container)
    docker.set_restart_policy(parked.id, journal.parked_restart or "no")
    if parked.status != "running":
        progress(f"rollback: starting {journal.container}")
        docker.start_container(parked.id)
    alive = wait_alive(docker, parked.id, url, health_timeout, progress, model=journal.model,
                       timeout_key="the larger of serve.health_timeout and deploy.health_timeout_s")
    if alive.failed:
        raise RollbackError(
            f"rolled back {journal.container}, but it is not alive: {alive.figure} ({alive.detail})",
            hint=f"look at `docker logs {journal.container}`; `vpatch deploy {journal.definition} --rollback` waits "
            f"again ({health_timeout:.0f}s); the journal {journal.path} keeps the state")
    journal = journal.advance(Phase.ROLLED_BACK, note=f"{journal.container} alive again after {alive.seconds:.0f}s")
    progress(f"rollback: {journal.container} is alive again ({alive.seconds:.0f}s), restart policy "
             f"{journal.parked_restart}")
    return Restored(kept, journal.container, alive.seconds, journal)


def _nothing_to_restore(docker: Docker, journal: Journal, candidate: ContainerInfo | None) -> None:
    """Never stop the only server for nothing: say what is missing, leave the candidate, fail."""
    missing = (f"the parked container {journal.parked_name} ({(journal.parked_id or '')[:12]}) is gone"
               if journal.parked_id else "no production container was running before this deploy")
    if candidate is not None and candidate.status == "running":
        left = f"{candidate.name} (the candidate, {journal.image}) keeps running"
    elif candidate is not None:
        left = f"the candidate {candidate.name} is {candidate.status}; nothing serves"
    else:
        left = "no candidate container exists either; nothing serves"
    journal.advance(journal.phase, note=f"rollback refused: {missing}")
    raise NothingRestored(
        f"nothing restored: {missing}; {left}",
        hint=f"nothing is left to roll back: remove the journal {journal.path}, then `vpatch serve "
        f"{journal.definition} --replace` starts production from the yaml (serve refuses while the journal is unfinished)")


def _retire_candidate(docker: Docker, journal: Journal, candidate: ContainerInfo | None,
                      progress: Progress) -> str | None:
    """Stop the candidate (verified by `identify`) and free the production name; it keeps its logs under another name."""
    if candidate is None:
        return journal.candidate_kept_as
    kept = candidate.name
    docker.set_restart_policy(candidate.id, "no")
    if candidate.status in ("running", "restarting", "paused"):
        progress(f"rollback: stopping the candidate {candidate.name}")
        docker.stop_container(candidate.id, timeout=10)  # a failed candidate needs no graceful drain
    if candidate.name == journal.container:
        kept = f"{journal.container}-candidate-{journal.started}"
        docker.rename_container(candidate.id, kept)
    return kept
