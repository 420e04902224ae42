"""The container side of a switch: watch a start, wait for health, park, and restore (the rollback)."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from vpatch.deploy.checks import CheckResult, Status
from vpatch.deploy.client import Server
from vpatch.deploy.journal import Journal, Phase
from vpatch.errors import VpatchError
from vpatch.image.docker import Docker
from vpatch.progress import Progress

_EXCEPTION = re.compile(r"\b\w*(?:Error|Exception): .*")
# Wrapper exceptions that only point at the real one above them (vLLM's engine start-up failure).
_POINTERS = ("see root cause above",)


class RollbackError(VpatchError):
    """Production could not be brought back to a healthy state; the journal keeps what is needed to retry."""


def stamp(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")


def last_error(log: str) -> str:
    """The line that says why a container died: the last exception message that is not a mere pointer
    to another one (vLLM's "Engine core initialization failed. See root cause above."), else the last line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for line in reversed(lines):
        found = _EXCEPTION.search(line)
        if found and not any(p in line.lower() for p in _POINTERS):
            return found[0][:400]
    return lines[-1][:400] if lines else "(no output)"


def _down(docker: Docker, cid: str) -> str | None:
    """Why the container is not serving (exited, restarting, gone), or None while it runs."""
    info = docker.container(cid)
    if info is None:
        return "the container is gone"
    if info.status in ("exited", "dead", "created"):
        return f"exited with code {info.exit_code}: {last_error(docker.container_logs(cid, tail=200))}"
    if info.status == "restarting" or info.restart_count > 0:
        return f"restarting (restart count {info.restart_count}): {last_error(docker.container_logs(cid, tail=200))}"
    return None


def watch_start(docker: Docker, cid: str, seconds: float) -> CheckResult:
    """'Started and not restarting': the container stays up for `seconds`; a crash loop fails within them."""
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        why = _down(docker, cid)
        if why is not None:
            return CheckResult("started", Status.FAIL, f"down after {elapsed:.0f}s", why, elapsed)
        time.sleep(0.5)
    return CheckResult("started", Status.PASS, f"running, no restart in {seconds:.0f}s", "", time.monotonic() - start)


def wait_healthy(docker: Docker, cid: str, server: Server, timeout: float, progress: Progress) -> CheckResult:
    """/health answers 200 within `timeout` while the container keeps running (serve's wait: an exit or a
    restart fails at once), as a check whose detail is the line that says why it died."""
    from vpatch.serve.run import wait_healthy as serve_wait

    start = time.monotonic()
    try:
        seconds = serve_wait(docker, cid, f"{server.base_url}/health", timeout=timeout, progress=progress)
    except VpatchError as exc:
        elapsed = time.monotonic() - start
        first = exc.message.splitlines()[0]
        why = f"{first} {last_error(exc.message)}" if "log" in first else first
        return CheckResult("health", Status.FAIL, f"not healthy after {elapsed:.0f}s", why, elapsed)
    return CheckResult("health", Status.PASS, f"healthy after {seconds:.0f}s", "", seconds)


def park(docker: Docker, journal: Journal, cid: str, restart: str) -> Journal:
    """Rename the production container (never delete it), set its restart policy to no, stop it."""
    parked = f"{journal.container}-parked-{journal.started}"
    journal = journal.advance(Phase.PARKING, parked_id=cid, parked_name=parked, parked_restart=restart)
    docker.set_restart_policy(cid, "no")
    docker.rename_container(cid, parked)
    docker.stop_container(cid)
    return journal


@contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """SIGTERM (an SSH drop, `kill`) interrupts like Ctrl-C, so both roll back the same way."""
    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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


def restore(docker: Docker, journal: Journal, server: Server, *, health_timeout: float, progress: Progress) -> Restored:
    """Roll back from any phase: stop and keep the candidate, rename the parked container back, restore its
    restart policy, start it and verify /health. Idempotent: it reads where things are, not where they were."""
    with uninterruptible():
        journal = journal.advance(Phase.ROLLING_BACK)
        kept = _retire_candidate(docker, journal, progress)
        journal = journal.advance(Phase.ROLLING_BACK, candidate_kept_as=kept)
        if journal.parked_id is None or docker.container(journal.parked_id) is None:
            note = "no production container was running before the deploy" if journal.parked_id is None else \
                f"the parked container {journal.parked_name} is gone"
            journal = journal.advance(Phase.ROLLED_BACK, note=note)
            return Restored(kept, None, None, journal)
        cid = journal.parked_id
        info = docker.container(cid)
        assert info is not None
        if info.name != journal.container:
            progress(f"rollback: renaming {info.name} back to {journal.container}")
            docker.rename_container(cid, journal.container)
        docker.set_restart_policy(cid, journal.parked_restart or "no")
        if info.status != "running":
            progress(f"rollback: starting {journal.container}")
            docker.start_container(cid)
        health = wait_healthy(docker, cid, server, health_timeout, progress)
        if health.failed:
            raise RollbackError(
                f"rolled back {journal.container}, but it is not healthy: {health.figure} ({health.detail})",
                hint=f"look at `docker logs {journal.container}`; the journal {journal.path} keeps the state")
        journal = journal.advance(Phase.ROLLED_BACK, note=f"{journal.container} healthy again after {health.seconds:.0f}s")
        progress(f"rollback: {journal.container} is healthy again ({health.seconds:.0f}s), restart policy "
                 f"{journal.parked_restart}")
        return Restored(kept, journal.container, health.seconds, journal)


def _retire_candidate(docker: Docker, journal: Journal, progress: Progress) -> str | None:
    """Stop the candidate and free the production name; it keeps its logs under another name."""
    candidate = docker.container(journal.candidate_id) if journal.candidate_id else None
    if candidate is None and journal.candidate_started:
        # Killed between `docker run` and the journal write: the candidate is whatever holds the name now.
        holder = docker.container(journal.container)
        if holder is not None and holder.id != journal.parked_id:
            candidate = holder
    if candidate is None:
        return journal.candidate_kept_as
    kept = candidate.name
    docker.set_restart_policy(candidate.id, "no")
    if candidate.status in ("running", "restarting"):
        progress(f"rollback: stopping the candidate {candidate.name}")
        docker.stop_container(candidate.id, timeout=10)  # a failed candidate needs no graceful drain
    if candidate.name == journal.container:
        kept = f"{journal.container}-candidate-{journal.started}"
        docker.rename_container(candidate.id, kept)
    return kept
