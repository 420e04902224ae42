"""`vpatch deploy`: baseline, park, start the candidate, check it, then keep it or roll back by itself."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch.base import ExitCode, ProcessError, Progress, VpatchError, interruptible, run_process
from vpatch.config import Suite
from vpatch.deploy.client import Server
from vpatch.deploy.container import (
    Restored,
    RollbackError,
    held,
    park,
    restore,
    stamp,
    wait_alive,
    watch_start,
)
from vpatch.deploy.journal import Journal, Phase
from vpatch.deploy.judge import CheckResult, Figures
from vpatch.deploy.ledger import SERVER, StartLedger, parse_start_log
from vpatch.deploy.live import LivePlan, LiveReport, PatchOutcome
from vpatch.deploy.live import run as run_live
from vpatch.deploy.measure import Run, run_checks, scan_log
from vpatch.deploy.memory import Source, container_source, gpu_source
from vpatch.deploy.readings import kv_pool_from_log
from vpatch.deploy.record import DeployRecord, Side, now_iso, recorded_baseline, suite_key
from vpatch.deploy.record import Source as BaselineSource
from vpatch.deploy.series import PassSeries
from vpatch.docker import Docker
from vpatch.serve import LABEL_DEFINITION, LABEL_DEPLOY, lint_command, refuse_taken_port, render_command, start
from vpatch.serve import base_url as alive_url

if TYPE_CHECKING:
    from vpatch.config import ServeConfig
    from vpatch.docker import ContainerInfo
    from vpatch.serve import RunCommand


class DeployDecision(str, Enum):
    DEPLOYED = "deployed"
    ROLLED_BACK = "rolled back"  # a check failed; production is back and healthy
    INTERRUPTED = "interrupted, rolled back"  # Ctrl-C or SIGTERM; production is back and healthy

    @property
    def exit_code(self) -> ExitCode:
        return {DeployDecision.DEPLOYED: ExitCode.OK, DeployDecision.ROLLED_BACK: ExitCode.ROLLED_BACK,
                DeployDecision.INTERRUPTED: ExitCode.INTERRUPTED}[self]


@dataclass(frozen=True)
class Outcome:
    """One server's pass through the suite."""

    checks: tuple[CheckResult, ...]
    figures: Figures
    series: PassSeries = field(default_factory=PassSeries)  # the samples the checks took (deploy/series.py)
    source: str = BaselineSource.MEASURED  # a baseline: measured now, or recorded at its own deploy
    recorded_at: str | None = None  # a recorded baseline: when (ISO)
    ledger: StartLedger = field(default_factory=StartLedger)  # what its start cost (deploy/ledger.py)

    def side(self, image_id: str | None) -> Side:
        return Side(self.checks, self.figures, self.series, self.source, self.recorded_at, image_id, self.ledger)


@dataclass(frozen=True)
class Step:
    name: str
    seconds: float


@dataclass(frozen=True)
class Report:
    definition: str
    container: str
    image: str
    decision: DeployDecision
    candidate: Outcome
    baseline: Outcome | None
    steps: tuple[Step, ...]
    parked_as: str | None  # where the old production container is now (deployed: parked; rolled back: None)
    candidate_kept_as: str | None  # a rolled-back candidate, stopped, with its logs
    rollback: str  # one sentence: what state production is in
    hooks: tuple[str, ...] = field(default_factory=tuple)  # hook commands that failed (after_switch)
    live: LiveReport | None = None  # the patches' live checks (deploy/live.py); None: none planned
    record: DeployRecord | None = None  # what was measured, as kept on disk (deploy/record.py)

    @property
    def failed_check(self) -> CheckResult | None:
        return next((c for c in self.candidate.checks if c.failed), None)


class BaselineMode(str, Enum):
    RECORDED = "recorded"  # the figures recorded when the running image was deployed; measured when there are none
    MEASURE = "measure"  # run the suite against production now
    NONE = "none"  # no baseline (a first deploy)


def memory_source(docker: Docker, serve: ServeConfig, container: str) -> Source:
    """Per card on a GPU host (nvidia-smi), else the container against its memory limit (docker's stats)."""
    return gpu_source() if serve.container.gpus is not None else container_source(docker, container)


def deploy(*, definition: str, serve: ServeConfig, suite: Suite, image: str, docker: Docker, cache: Path,
           progress: Progress, live: LivePlan | None = None, baseline: BaselineMode = BaselineMode.RECORDED,
           reach: str | None = None, daemon: tuple[str, ...] = ()) -> Report:
    """Switch the container of `serve` to `image` with the checks of `suite`, then the patches' live checks
    of `live`; roll back when one fails. On a host of `hosts:`, `reach` is the machine its server answers on and
    `daemon` the docker CLI's options that reach its daemon (the caller holds its state: `FleetHost.state`)."""
    # Ctrl-C and SIGTERM are ours from the first instruction on, whatever the process inherited.
    with interruptible(), held(serve.container.name, serve.port, f"vpatch deploy {definition}"):
        return _deploy(definition=definition, serve=serve, suite=suite, image=image, docker=docker, cache=cache,
                       progress=progress, live=live, mode=baseline, reach=reach or serve.host, daemon=daemon)


@dataclass
class _Deploying:
    """One deploy in progress: what its steps share, kept up to date as they go, so that a step cut short (an
    interrupt, an error) leaves what it had measured to the rollback, the record and the report."""

    definition: str
    serve: ServeConfig
    suite: Suite
    image: str
    docker: Docker
    progress: Progress
    live: LivePlan | None
    production: ContainerInfo | None  # the container running under the name before the deploy
    command: RunCommand  # the candidate's `docker run`, linted
    server: Server
    journal: Journal
    record: DeployRecord
    steps: list[Step] = field(default_factory=list)
    clock: float = field(default_factory=time.monotonic)
    baseline: Outcome | None = None
    base_live: list[PatchOutcome] = field(default_factory=list)
    cand_live: list[PatchOutcome] = field(default_factory=list)
    candidate: list[CheckResult] = field(default_factory=list)
    figures: Figures = field(default_factory=Figures)
    series: PassSeries = field(default_factory=PassSeries)
    image_id: str | None = None
    reach: str | None = None  # the machine its server answers on (serve.host, or the fleet host's)

    @property
    def name(self) -> str:
        return self.serve.container.name

    def step(self, label: str) -> None:
        """A step of the runbook is done: its time since the previous one."""
        self.steps.append(Step(label, time.monotonic() - self.clock))
        self.clock = time.monotonic()

    @property
    def passed(self) -> bool:
        return not any(c.failed for c in self.candidate)


def _deploy(*, definition: str, serve: ServeConfig, suite: Suite, image: str, docker: Docker, cache: Path,
            progress: Progress, live: LivePlan | None, mode: BaselineMode, reach: str | None,
            daemon: tuple[str, ...]) -> Report:
    """The runbook: refuse what is not ours, lint, baseline, park, start, check, keep or roll back, record."""
    production = _refuse_to_start(definition, serve, docker)
    run = _prepare(definition=definition, serve=serve, suite=suite, image=image, docker=docker, cache=cache,
                   progress=progress, live=live, production=production, reach=reach, daemon=daemon)
    try:
        _baseline(run, mode)
        run_hooks(suite.hooks.before_switch, "before_switch", progress, strict=True)
    except BaseException as exc:
        # Nothing was switched: close the journal so that --status does not report a deploy in progress.
        run.journal.advance(Phase.ROLLED_BACK, note=f"stopped before the switch ({type(exc).__name__}); nothing was switched")
        raise
    restored: Restored | None
    try:
        cid = _switch(run)
        _check_candidate(run, cid)
        run.step("checks")
        if run.passed:
            _keep(run, cid)
    except KeyboardInterrupt:
        progress("interrupted: rolling back")
        restored = _rollback_or_raise(docker, definition, progress, "interrupted")
        run.step("rollback")
        decision = DeployDecision.INTERRUPTED
    except VpatchError as exc:
        progress(f"error: {exc.message}; rolling back")
        restored = _rollback_or_raise(docker, definition, progress, exc.message)
        _record_error(run, exc, restored)
        raise VpatchError(f"{exc.message}\nrolled back: {describe(restored)}", hint=exc.hint) from exc
    else:
        if run.passed:
            decision, restored = DeployDecision.DEPLOYED, None
        else:
            progress("a check failed: rolling back")
            restored = _rollback_or_raise(docker, definition, progress, "a check failed")
            run.step("rollback")
            decision = DeployDecision.ROLLED_BACK
    return _finish(run, decision, restored)


def _refuse_to_start(definition: str, serve: ServeConfig, docker: Docker) -> ContainerInfo | None:
    """Refuse a deploy over an unfinished one, or over another definition's container; the production
    container (None: there is none)."""
    current = Journal.load(definition)
    if current is not None and not current.phase.settled:
        raise VpatchError(
            f"a deploy of {definition} did not finish (phase {current.phase.value}, started {current.started})",
            hint=f"`vpatch deploy {definition} --status` shows where things are; `--rollback` restores production")
    name = serve.container.name
    _refuse_others(definition, name, serve.port)
    production = docker.container(name)
    owner = production.labels.get(LABEL_DEFINITION) if production is not None else None
    if production is not None and owner not in (None, definition):
        raise VpatchError(f"the container {name} ({production.id[:12]}, {production.status}) is labelled for the "
                          f"definition {owner!r}, not {definition!r}: a deploy of {definition} would park another "
                          "definition's production", hint=f"deploy it as `vpatch deploy {owner}`, or give "
                          f"serve.container.name another name in images/{definition}.yaml")
    return production


def _prepare(*, definition: str, serve: ServeConfig, suite: Suite, image: str, docker: Docker, cache: Path,
             progress: Progress, live: LivePlan | None, production: ContainerInfo | None, reach: str | None,
             daemon: tuple[str, ...]) -> _Deploying:
    """Lint the candidate's command, then open the journal and the record: nothing is touched yet."""
    started = stamp()
    # Lint before anything is stopped: an entrypoint that already serves plus `serve` again, or a flag the
    # image's vLLM does not know, is refused while production still runs untouched.
    command = render_command(serve, image, definition=definition, restart="no", labels={LABEL_DEPLOY: started},
                             daemon=daemon)
    lint_command(docker, command, definition=definition, cache=cache, progress=progress)
    server = Server(alive_url(serve.port, reach), timeout=suite.request_timeout_s)
    journal = Journal(definition, serve.container.name, image, Phase.BASELINE, started=started, port=serve.port,
                      health_timeout_s=suite.health_timeout_s, host=reach, model=serve.model_name,
                      restore_timeout_s=float(max(serve.health_timeout, suite.health_timeout_s))).save()
    clock = time.monotonic()
    record = DeployRecord(definition, serve.container.name, image, journal.started, suite_key(suite)).save()
    return _Deploying(definition, serve, suite, image, docker, progress, live, production, command, server,
                      journal, record, clock=clock, reach=reach)


def _baseline(run: _Deploying, mode: BaselineMode) -> None:
    """The running production's figures: none, the ones recorded at its own deploy, or measured now."""
    production, progress = run.production, run.progress
    if production is None or production.status != "running":
        return
    found = recorded_baseline(run.definition, production.image_id, run.record.suite_key) \
        if mode is BaselineMode.RECORDED else None
    if mode is BaselineMode.NONE:
        progress(f"baseline: none (--baseline none); {run.name} is not measured")
    elif found is not None:
        run.baseline = Outcome(found.checks, found.figures, found.series, found.source, found.recorded_at,
                               found.ledger)
        progress(f"baseline: the figures recorded when {production.image_ref} was deployed "
                 f"({found.recorded_at}); no request goes to production (--baseline measure measures it)")
    else:
        if mode is BaselineMode.RECORDED:
            progress(f"baseline: nothing recorded for {production.image_ref} ({production.image_id[:19]}) "
                     "with this suite: measuring production")
        run.baseline = _measure_production(run, production)
    if run.baseline is not None:
        run.record = replace(run.record, baseline=run.baseline.side(production.image_id)).save()
    run.step("baseline")


def _measure_production(run: _Deploying, production: ContainerInfo) -> Outcome:
    """The suite (and the live checks, which decide nothing here) against the running production."""
    docker = run.docker
    run.progress(f"baseline: checking the running {run.name} ({production.image_ref})")
    prod_id, since = production.id, production.started_at
    # Its log since its latest start: earlier runs (and their shutdowns) are not this server's state.
    measured = Run(run.server, run.suite, lambda: docker.container_logs(prod_id, since=since), run.progress,
                   memory_source=memory_source(docker, run.serve, prod_id))
    run_checks(measured, fail_fast=False, log_scan=False)
    # The live checks on the baseline are shown beside the candidate's; they decide nothing.
    run.base_live = run_live(run.live, run.server, run.progress, fail_fast=False) if run.live is not None else []
    served = tuple(measured.results) + tuple(o.as_check() for o in run.base_live)
    return Outcome((*served, scan_log(measured)), measured.figures, measured.series,
                   ledger=_ledger(docker, prod_id, since=since))


def _switch(run: _Deploying) -> str:
    """Park production (stopped, restart policy no) and start the candidate under its name; the candidate's id."""
    production, progress = run.production, run.progress
    if production is not None:
        progress(f"park: {run.name} -> {run.name}-parked-{run.journal.started} (restart policy no, stopped)")
        run.journal = park(run.docker, run.journal, production.id, production.restart_policy)
        run.step("park")
    # Production is stopped: whatever still answers on its port is someone else's, and the health wait
    # would ask it instead of the candidate.
    refuse_taken_port(run.serve.port, run.reach, source=f"images/{run.definition}.yaml")
    run.journal = run.journal.advance(Phase.STARTING, candidate_started=True)
    progress(f"start: {run.image} as {run.name} on port {run.serve.port}")
    cid = start(run.docker, run.command)
    run.journal = run.journal.advance(Phase.CHECKING, candidate_id=cid)
    run.step("start")
    return cid


def _check_candidate(run: _Deploying, cid: str) -> None:
    """The candidate's start and health, then the suite, the live checks and the log scan, each only while
    all before it passed; the record is saved after each."""
    docker, suite, progress = run.docker, run.suite, run.progress
    starts: list[tuple[str, Callable[[], CheckResult]]] = [
        ("started", lambda: watch_start(docker, cid, suite.start_watch_s)),
        ("health", lambda: wait_alive(docker, cid, run.server.base_url, suite.health_timeout_s, progress,
                                      model=run.serve.model_name))]
    for label, check in starts:
        progress(f"check: {label}")
        result = check()
        run.candidate.append(result)
        progress(f"  {result.status.value}: {result.figure}" + (f" ({result.detail})" if result.failed else ""))
        if result.failed:
            break
    run.image_id = _image_id(docker, cid)
    run.record = replace(run.record, candidate=Outcome(tuple(run.candidate), run.figures).side(run.image_id)).save()
    if run.passed:
        _run_suite(run, cid)


def _run_suite(run: _Deploying, cid: str) -> None:
    """The suite against the healthy candidate (fail fast), then the patches' live checks, then the log scan."""
    docker, production = run.docker, run.production
    pool = kv_pool_from_log(docker.container_logs(production.id)) if production and run.baseline else None
    starts_done = tuple(run.candidate)

    def keep(checked: Run) -> None:
        # After each check: a kill -9 from here on leaves what was measured up to it.
        side = Outcome((*starts_done, *checked.results), checked.figures, checked.series).side(run.image_id)
        run.record = replace(run.record, candidate=side).save()
    checks = Run(run.server, run.suite, lambda: docker.container_logs(cid), run.progress, baseline_pool=pool,
                 memory_source=memory_source(docker, run.serve, cid), on_check=keep)
    run_checks(checks, fail_fast=True, log_scan=False)
    run.candidate += checks.results
    run.figures = checks.figures
    run.series = checks.series
    if run.live is not None and run.passed:
        run.cand_live = run_live(run.live, run.server, run.progress, fail_fast=True)
        run.candidate += [o.as_check() for o in run.cand_live]
    # Last, so that a Traceback or an allocation failure a live-check request caused is seen too.
    if run.passed:
        run.candidate.append(scan_log(checks))
        run.figures = checks.figures  # with the log scan's count


def _keep(run: _Deploying, cid: str) -> None:
    """The candidate passed: it gets production's restart policy and the journal says deployed."""
    restart = run.serve.container.restart
    run.docker.set_restart_policy(cid, restart)
    run.journal = run.journal.advance(Phase.DEPLOYED, note=f"passed {len(run.candidate)} checks")
    run.progress(f"deployed: {run.image} serves as {run.name} (restart policy {restart})")


def _record_error(run: _Deploying, exc: VpatchError, restored: Restored) -> None:
    """An error rolled the deploy back: the record on disk (the checks so far, as they were saved) says so."""
    kept = DeployRecord.load(run.record.path) or run.record
    replace(kept, decision="error, rolled back", rollback=f"{exc.message}; {describe(restored)}",
            steps=tuple((s.name, s.seconds) for s in run.steps), finished=now_iso()).save()


def _finish(run: _Deploying, decision: DeployDecision, restored: Restored | None) -> Report:
    """After the switch or the rollback: the after_switch hooks, the candidate's start ledger, the record's
    last save and the report."""
    name, image, definition, journal = run.name, run.image, run.definition, run.journal
    failed_hooks = run_hooks(run.suite.hooks.after_switch, "after_switch", run.progress, strict=False)
    healthy = next((c for c in run.candidate if c.name == "health" and not c.failed), None)
    ledger = _ledger(run.docker, journal.candidate_id, healthy_s=healthy.seconds if healthy else None)
    outcome = Outcome(tuple(run.candidate), run.figures, run.series, ledger=ledger)
    failed = next((c for c in run.candidate if c.failed), None)
    rolled = describe(restored) if restored else (f"{name} runs {image}; the old container is parked "
                                                  f"as {journal.parked_name or '(none)'}")
    record = replace(run.record, candidate=outcome.side(run.image_id), decision=decision.value,
                     failed_check=failed.name if failed else None, rollback=rolled,
                     steps=tuple((s.name, s.seconds) for s in run.steps), finished=now_iso()).save()
    live = run.live
    return Report(
        definition=definition, container=name, image=image, decision=decision,
        candidate=outcome, baseline=run.baseline, steps=tuple(run.steps), record=record,
        parked_as=journal.parked_name if decision is DeployDecision.DEPLOYED else None,
        candidate_kept_as=restored.candidate_kept_as if restored else None,
        rollback=describe(restored) if restored else f"{name} runs {image}; the old container is parked "
        f"as {journal.parked_name or '(none)'} (`vpatch deploy {definition} --rollback` brings it back)",
        hooks=tuple(failed_hooks),
        live=LiveReport(live, tuple(run.cand_live), tuple(run.base_live)) if live is not None else None,
    )


def _ledger(docker: Docker, container: str | None, *, since: str | None = None,
            healthy_s: float | None = None) -> StartLedger:
    """The start ledger from the container's own log (since its latest start), with the time to healthy as
    the health check measured it. A container gone or a daemon away leaves it empty: absent, never guessed."""
    if container is None:
        return StartLedger()
    try:
        info = docker.container(container)
        started = _utc(info.started_at) if info is not None else None
        found = parse_start_log(docker.container_logs(container, since=since), started_at=started)
    except VpatchError:
        return StartLedger()
    return found.with_value("healthy_s", SERVER, healthy_s) if healthy_s is not None else found


def _utc(stamp: str | None) -> datetime | None:
    """Docker's State.StartedAt ("2026-12-04T16:56:05.123456789Z") as a datetime; None when unreadable."""
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", stamp).replace("Z", "+00:00"))
    except ValueError:
        return None


def _image_id(docker: Docker, cid: str) -> str | None:
    info = docker.container(cid)
    return info.image_id if info else None


def describe(restored: Restored) -> str:
    if restored.production is None:
        return f"no production container to restore ({restored.journal.note}); candidate kept as {restored.candidate_kept_as}"
    return (f"{restored.production} is running again, verified alive after {restored.healthy_after_s:.0f}s, restart "
            f"policy {restored.journal.parked_restart}; the candidate is stopped and kept as {restored.candidate_kept_as}")


def _rollback_or_raise(docker: Docker, definition: str, progress: Progress, why: str) -> Restored:
    # The journal on disk, not the one in memory: an interrupt can land between a write and its return.
    journal = Journal.load(definition)
    assert journal is not None
    try:
        return restore(docker, journal, url=journal.url, health_timeout=journal.restore_wait_s,
                       progress=progress, automatic=True)
    except VpatchError as exc:
        raise RollbackError(f"{why}; and the rollback failed: {exc.message}",
                            hint=f"`vpatch deploy {definition} --rollback` retries; --status shows the state") from exc


def rollback(*, definition: str, docker: Docker, progress: Progress) -> Restored:
    """`vpatch deploy NAME --rollback`: bring the parked container back, after a kill or after a deploy. It
    needs only the journal and the daemon (never images/NAME.yaml: recovery must not depend on it)."""
    first = Journal.load(definition)
    if first is None:
        raise VpatchError(f"no deploy of {definition} is recorded on this host ({Journal.path_for(definition)})",
                          hint="nothing to roll back; `docker ps -a` shows the containers")
    with held(first.container, first.port, f"vpatch deploy {definition} --rollback"):
        journal = Journal.load(definition)  # again, under the lock: a deploy may have moved it meanwhile
        if journal is None:
            raise VpatchError(f"no deploy of {definition} is recorded on this host ({Journal.path_for(definition)})",
                              hint="nothing to roll back; `docker ps -a` shows the containers")
        if journal.phase is Phase.ROLLED_BACK:
            # A journal closed without a note (a hand-written one) said "rolled back ()".
            raise VpatchError(f"the last deploy of {definition} was already rolled back"
                              + (f" ({journal.note})" if journal.note else ""),
                              hint=f"nothing to roll back; `vpatch deploy {definition} --status` shows what runs")
        if journal.phase is Phase.BASELINE:
            journal.advance(Phase.ROLLED_BACK, note="stopped during the baseline: nothing had been switched")
            raise VpatchError(f"the last deploy of {definition} stopped during the baseline; nothing had been switched",
                              hint="production was never touched; the journal is now closed")
        return restore(docker, journal, url=journal.url, health_timeout=journal.restore_wait_s, progress=progress)


def holders(definition: str, container: str, port: int | None) -> list[Journal]:
    """The unfinished deploys of other definitions on `container` or `port`: a definition renamed mid-deploy
    (tiny.yaml -> tiny2.yaml) finds its deploy under the old name here."""
    return [j for j in Journal.all() if j.definition != definition and not j.phase.settled
            and (j.container == container or (port is not None and j.port == port))]


def _refuse_others(definition: str, container: str, port: int) -> None:
    for other in holders(definition, container, port):
        shared = f"the container {container}" if other.container == container else f"port {port}"
        raise VpatchError(
            f"an unfinished deploy of {other.definition} (phase {other.phase.value}, started {other.started}) "
            f"holds {shared}: a deploy of {definition} there would act on its containers",
            hint=f"if images/{other.definition}.yaml was renamed to {definition}.yaml, finish that deploy first: "
            f"`vpatch deploy {other.definition} --status`, then `vpatch deploy {other.definition} --rollback`")


@dataclass(frozen=True)
class Where:
    journal: Journal | None
    containers: tuple[tuple[str, str, str], ...]  # (role, name, status) as the daemon sees them now
    others: tuple[Journal, ...] = ()  # other definitions' unfinished deploys on the same container or port


def where(*, definition: str, docker: Docker, container: str | None = None, port: int | None = None) -> Where:
    """`vpatch deploy NAME --status`: the journal and the containers it names, as they are now; with the
    definition's `container` and `port` (when its yaml reads), other definitions' unfinished deploys there."""
    journal = Journal.load(definition)
    others = tuple(holders(definition, container, port)) if container is not None else ()
    if journal is None:
        return Where(None, (), others)
    rows = []
    for role, ref in (("production name", journal.container), ("parked", journal.parked_id),
                      ("candidate", journal.candidate_id)):
        info = docker.container(ref) if ref else None
        rows.append((role, info.name if info else (ref or "-"), f"{info.status} ({info.restart_policy})" if info else "absent"))
    return Where(journal, tuple(rows), others)


def run_hooks(commands: Sequence[Sequence[str]], label: str, progress: Progress, *, strict: bool) -> list[str]:
    """Run hook commands in order (argv lists, no shell); before_switch must succeed, after_switch is reported."""
    failed = []
    for argv in commands:
        progress(f"{label}: {' '.join(argv)}")
        try:
            run_process(argv, timeout=600, merge_output=True,
                        hint="nothing was switched; fix the hook in deploy.hooks of the image definition")
        except ProcessError as exc:
            if strict:
                raise VpatchError(f"{label} hook failed: {exc.message}", hint=exc.hint) from exc
            failed.append(exc.message)
    return failed
