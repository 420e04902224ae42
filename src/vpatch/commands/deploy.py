"""`vpatch deploy`: switch production with checks and roll back by itself; --status, --rollback, --prune."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch.base import ExitCode, VpatchError, atomic_write, cache_dir
from vpatch.commands import console, echo, load_config, progress
from vpatch.config import ImageDefinition
from vpatch.deploy import (
    BaselineMode,
    DeployRecord,
    Journal,
    deploy,
    deploy_fleet,
    holders,
    plan_live,
    prune_containers,
    rollback,
    where,
)
from vpatch.deploy import rollback as rollback_deploy
from vpatch.docker import Docker
from vpatch.report import (
    deploy_json,
    deploy_lines,
    deploy_page,
    deploy_status_lines,
    deploy_tables,
    fleet_deploy_json,
    fleet_deploy_lines,
    live_plan_notes,
    page_line,
    prune_lines,
    rolled_back_line,
)
from vpatch.serve import connect_all, places

if TYPE_CHECKING:
    from vpatch.config import Config, ServeConfig


def run(*, project: Path, name: str, image: str | None, rollback: bool, where: bool, prune: bool, keep: int | None,
        as_json: bool, report: bool = False, out: Path | None = None, baseline: str = "recorded",
        host: str | None = None) -> ExitCode:
    """Refuse what one mode would ignore, then run the one mode asked for."""
    _refuse_combinations(name, image=image, rollback=rollback, where=where, prune=prune, keep=keep, as_json=as_json)
    modes = {m.value: m for m in BaselineMode}
    if baseline not in modes:
        raise VpatchError(f"--baseline {baseline} is not one of {', '.join(modes)}",
                          hint="recorded (the default) spares production; measure measures it afresh; none skips it")
    if out is not None and not report:
        raise VpatchError("--out needs --report", hint=f"`vpatch deploy {name} --report --out FILE`")
    if report and host is None:
        return show_report(name, out=out)
    if host is not None and (report or prune):
        raise VpatchError(f"--host goes with a deploy, --status or --rollback, not {'--report' if report else '--prune'}",
                          hint=f"`vpatch deploy {name} --host {host}`")
    if host is not None and (where or rollback):
        return on_host(project, name, host, rollback=rollback)
    fleet = _hosts_if_readable(project, name) if where or rollback else ()
    if fleet and rollback:
        raise VpatchError(f"images/{name}.yaml has hosts ({', '.join(fleet)}): --rollback acts on one host's deploy",
                          hint=f"`vpatch deploy {name} --status` shows each host's; then `vpatch deploy {name} "
                          f"--rollback --host {fleet[-1]}`")
    if fleet:
        codes = [on_host(project, name, each, rollback=False) for each in fleet]
        return ExitCode.UNFINISHED if ExitCode.UNFINISHED in codes else ExitCode.OK
    # --status, --rollback and --prune need only the journal and the daemon: recovery never depends on the yaml.
    if where:
        return show_status(project, name)
    if rollback:
        return roll_back(project, name)
    if prune:
        return prune_old(name, keep=1 if keep is None else keep)
    return deploy_image(project, name, image=image, as_json=as_json, baseline=modes[baseline], host=host)


def on_host(project: Path, name: str, host: str, *, rollback: bool) -> ExitCode:
    """`--status` or `--rollback` on one host of images/NAME.yaml's hosts: its daemon, its own journal."""
    definition = ImageDefinition.load(load_config(project).root, name)
    ((place, docker),) = connect_all(places(definition, host), progress)
    serve = place.definition.serve
    with place.state():
        if rollback:
            echo(rolled_back_line(rollback_deploy(definition=name, docker=docker, progress=progress)))
            return ExitCode.OK
        found = where(definition=name, docker=docker, container=serve.container.name if serve else None,
                      port=serve.port if serve else None)
    for line in deploy_status_lines(name, found, place.name):
        echo(line)
    unfinished = (found.journal is not None and not found.journal.phase.settled) or bool(found.others)
    return ExitCode.UNFINISHED if unfinished else ExitCode.OK


def deploy_on_fleet(config: Config, definition: ImageDefinition, *, host: str | None, image: str | None,
                    as_json: bool, baseline: BaselineMode) -> ExitCode:
    """The fleet in order, the standby first; every host reached before anything is touched on any."""
    definition.validate()  # every section, on every host, before anything is reached
    connected = connect_all(places(definition, host), progress)
    result = deploy_fleet(config, connected=connected, image=image or definition.moving_ref, cache=cache_dir(),
                          progress=progress, baseline=baseline)
    pages = []
    for step in result.steps:
        if step.report is not None and step.report.record is not None:
            with next(p for p, _ in connected if p.name == step.host).state():
                pages.append(_write_report(step.report.record, None, None))
    if as_json:
        echo(json.dumps(fleet_deploy_json(result), indent=2))
    else:
        shell = console()
        for step in result.steps:
            echo(f"== host {step.host} ({step.role.value}) ==")
            if step.report is not None:
                for table in deploy_tables(step.report):
                    shell.print(table)
                for line in deploy_lines(step.report):
                    echo(line)
        for line in fleet_deploy_lines(result):
            echo(line)
    for page in pages:
        (progress if as_json else echo)(page_line(page))
    if result.deployed:
        return ExitCode.OK
    last = result.steps[-1]
    return last.report.decision.exit_code if last.report is not None else ExitCode.ERROR


def show_report(name: str, *, out: Path | None) -> ExitCode:
    """`--report`: the last deploy's HTML page again, from the state folder only: a report of a deploy that was
    killed must not need the yaml or the daemon."""

    record = DeployRecord.latest(name)
    if record is None:
        raise VpatchError(f"no deploy of {name} is recorded on this host ({DeployRecord.folder()})",
                          hint=f"`vpatch deploy {name}` writes one (and its report) as it runs")
    journal = Journal.load(name)
    phase = journal.phase.value if journal is not None and journal.started == record.started else None
    echo(page_line(_write_report(record, out, phase)))
    return ExitCode.OK


def show_status(project: Path, name: str) -> ExitCode:
    """`--status`: where the last deploy stands; exit 8 while it is unfinished."""
    docker = Docker.connect()
    serve = _serve_if_readable(project, name)
    found = where(definition=name, docker=docker, container=serve.container.name if serve else None,
                          port=serve.port if serve else None)
    for line in deploy_status_lines(name, found):
        echo(line)
    unfinished = (found.journal is not None and not found.journal.phase.settled) or bool(found.others)
    return ExitCode.UNFINISHED if unfinished else ExitCode.OK


def roll_back(project: Path, name: str) -> ExitCode:
    """`--rollback`: bring the parked production container back."""
    docker = Docker.connect()
    serve = _serve_if_readable(project, name) if Journal.load(name) is None else None
    for other in holders(name, serve.container.name, serve.port) if serve else []:
        # A renamed definition (tiny.yaml -> tiny2.yaml): its deploy is recorded under the old name.
        raise VpatchError(f"no deploy of {name} is recorded on this host, but an unfinished deploy of "
                          f"{other.definition} ({other.phase.value}) holds {other.container} (port {other.port})",
                          hint=f"`vpatch deploy {other.definition} --rollback` restores production")
    restored = rollback(definition=name, docker=docker, progress=progress)
    echo(rolled_back_line(restored))
    return ExitCode.OK


def prune_old(name: str, *, keep: int) -> ExitCode:
    """`--prune`: remove old parked and candidate containers, keeping the `keep` newest of each kind."""

    for line in prune_lines(prune_containers(Docker.connect(), name, keep=keep)):
        echo(line)
    return ExitCode.OK


def deploy_image(project: Path, name: str, *, image: str | None, as_json: bool, baseline: BaselineMode,
                 host: str | None = None) -> ExitCode:
    """The switch: verify the candidate, baseline, park production, start and check the candidate, keep it or
    roll back; exit 6 when it rolled back."""

    config = load_config(project)
    definition = ImageDefinition.load(config.root, name)
    if definition.hosts or host is not None:
        return deploy_on_fleet(config, definition, host=host, image=image, as_json=as_json, baseline=baseline)
    if definition.serve is None:
        raise VpatchError(f"images/{name}.yaml has no serve: section", hint="deploy starts the candidate from serve:")
    docker = Docker.connect()
    definition.validate()  # every section and the rules between them, before production is touched
    candidate = image or definition.moving_ref
    production = docker.container(definition.serve.container.name)
    # Before anything is touched: verify the candidate against its labels and gather the live checks it owes.
    plan = plan_live(config, candidate=candidate, docker=docker, serve=definition.serve, progress=progress,
                     baseline=production.image_id if production is not None and production.status == "running" else None)
    for line in live_plan_notes(plan):
        echo(line, err=True)
    result = deploy(definition=name, serve=definition.serve, suite=definition.deploy, image=candidate,
                           docker=docker, cache=cache_dir(), progress=progress, live=plan, baseline=baseline)
    page = _write_report(result.record, None, None) if result.record is not None else None
    if as_json:
        echo(json.dumps(deploy_json(result), indent=2))
        if page is not None:
            progress(page_line(page))
    else:
        shell = console()
        for table in deploy_tables(result):
            shell.print(table)
        for line in deploy_lines(result):
            echo(line)
        if page is not None:
            echo(page_line(page))
    return result.decision.exit_code


def _serve_if_readable(project: Path, name: str) -> ServeConfig | None:
    """images/NAME.yaml's serve: section when it reads: --status then also finds another definition's
    unfinished deploy on its container or port (a renamed definition's). Recovery never needs it."""

    try:
        return ImageDefinition.load(load_config(project).root, name).serve
    except VpatchError:
        return None


def _hosts_if_readable(project: Path, name: str) -> tuple[str, ...]:
    """The names of images/NAME.yaml's hosts, the standby first, when it reads (each keeps its own journal); ()
    otherwise."""

    try:
        definition = ImageDefinition.load(load_config(project).root, name)
        return tuple(p.name for p in places(definition)) if definition.hosts else ()
    except VpatchError:
        return ()


def _refuse_combinations(name: str, *, image: str | None, rollback: bool, where: bool, prune: bool, keep: int | None,
                         as_json: bool) -> None:
    """Options that would be ignored are refused: each ignored one did something else without a word (the
    audit: `--keep 0` without --prune began a real deploy, `--status --rollback` only showed the status)."""
    modes = [flag for flag, on in (("--status", where), ("--rollback", rollback), ("--prune", prune)) if on]
    if len(modes) > 1:
        raise VpatchError(f"{' and '.join(modes)} cannot be combined: each is a command of its own",
                          hint=f"run `vpatch deploy {name} {modes[0]}`, then `vpatch deploy {name} {modes[1]}`")
    if keep is not None and not prune:
        raise VpatchError("--keep goes with --prune only; without it a real deploy would begin",
                          hint=f"`vpatch deploy {name} --prune --keep {keep}`")
    if image is not None and modes:
        raise VpatchError(f"--image goes with a deploy only: {modes[0]} acts on what the journal recorded",
                          hint=f"`vpatch deploy {name} {modes[0]}` without --image")
    if image is not None and not image.strip():
        raise VpatchError("--image is empty: the deploy would switch to the definition's moving tag",
                          hint=f"name the candidate image, or leave --image out for images/{name}.yaml's moving tag")
    if as_json and modes:
        raise VpatchError(f"--json goes with a deploy's report only, not {modes[0]}",
                          hint=f"`vpatch deploy {name} {modes[0]}` without --json")


def _write_report(record: DeployRecord, out: Path | None, phase: str | None) -> Path:
    """The deploy's HTML page, written atomically beside its record (or to `out`); its path."""

    path = out or record.html_path
    atomic_write(path, deploy_page(record, phase=phase).encode(), durable=False)
    return path
