"""`vpatch serve`: start, print, check or diff the server images/NAME.yaml's serve: section describes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch.base import ExitCode, VpatchError, cache_dir
from vpatch.commands import echo, load_config, progress
from vpatch.config import ImageDefinition, image_reference_ok
from vpatch.deploy import Journal, holders
from vpatch.docker import Docker
from vpatch.report import container_check_line, drift_json, drift_lines, fleet_drift_json, fleet_drift_lines, served_lines
from vpatch.serve import (
    check_container,
    connect_all,
    container_drift,
    fleet_drift,
    health_url,
    places,
    serve_command,
    serve_definition,
)

if TYPE_CHECKING:
    from vpatch.config import ImageDefinition, Pin, ServeConfig
    from vpatch.docker import Docker


def run(*, project: Path, name: str, print_only: bool, diff: bool, image: str | None, replace: bool, json_out: bool,
        check: bool, host: str | None = None) -> ExitCode:
    modes = [flag for flag, on in (("--print", print_only), ("--diff", diff), ("--check", check)) if on]
    if len(modes) > 1 or (replace and modes):
        both = modes if len(modes) > 1 else [modes[0], "--replace"]
        # Each ignored option did something else without a word (`--print --diff` printed, exit 0).
        raise VpatchError(f"{' and '.join(both)} cannot be combined: each is a command of its own",
                          hint=f"run `vpatch serve {name} {both[0]}`, then `vpatch serve {name} {both[1]}`")
    if json_out and not diff:
        raise VpatchError("--json goes with --diff only", hint=f"`vpatch serve {name} --diff --json`")
    if image is not None and (check or not image_reference_ok(image)):
        raise VpatchError(f"--image {image!r} is not an image reference (lower-case [registry/]path[:tag])"
                          if not check else "--image goes not with --check: --check asks the running container",
                          hint="name the image as `docker images` shows it, e.g. ml/vllm:cpu-next")
    # The whole definition, every section and the rules between them, before anything is shown or touched.
    config = load_config(project)
    definition = ImageDefinition.load(config.root, name).validate()
    if definition.hosts or host is not None:
        return on_fleet(definition, host=host, print_only=print_only, diff=diff, check=check, image=image,
                        replace=replace, json_out=json_out, pin=config.pin)
    if print_only:
        for line in serve_command(definition, image=image).shell_lines():
            echo(line)
        return ExitCode.OK

    docker = Docker.connect()
    if check:
        return check_alive(docker, definition)
    if diff:
        return show_drift(docker, definition, image=image, pin=config.pin, json_out=json_out)
    return start(docker, definition, image=image, replace=replace)


def on_fleet(definition: ImageDefinition, *, host: str | None, print_only: bool, diff: bool, check: bool,
             image: str | None, replace: bool, json_out: bool, pin: Pin) -> ExitCode:
    """The same modes over images/NAME.yaml's hosts (or --host's alone): every host is reached before anything
    is started on any."""
    fleet = places(definition, host)
    if print_only:
        for place in fleet:
            echo(f"# host {place.name} ({place.role.value})")
            for line in place.serve_command(image).shell_lines():
                echo(line)
        return ExitCode.OK
    connected = connect_all(fleet, progress)
    if diff:
        found = fleet_drift(connected, image=image, pin=pin)
        if json_out:
            echo(json.dumps(fleet_drift_json(found), indent=2))
        else:
            for line in fleet_drift_lines(found, definition.name):
                echo(line)
        return ExitCode.OK if all(d.clean for d in found) else ExitCode.DRIFT
    if check:
        verdicts = []
        for place, docker in connected:
            with place.state():
                verdicts.append(check_container(docker, place.definition, state_dir=Journal.folder().parent / "serve",
                                                server_host=place.server_host))
        for place, checked in zip(fleet, verdicts, strict=True):
            echo(f"{place.name}: {container_check_line(checked)}")
        return ExitCode.OK if all(c.alive for c in verdicts) else ExitCode.ERROR
    for place, docker in connected:
        with place.state():
            _refuse_unfinished_deploys(definition.name, place.definition.serve)
            served = serve_definition(docker, place.definition, cache=cache_dir(), image=image, replace=replace,
                                      progress=progress, place=place)
        assert place.definition.serve is not None  # validated: serving needs a serve section
        for line in served_lines(served, health_url(place.definition.serve.port, place.server_host)):
            echo(f"{place.name}: {line}")
    return ExitCode.OK


def check_alive(docker: Docker, definition: ImageDefinition) -> ExitCode:
    """`--check`: is the running server alive (the container health check's rule)."""

    checked = check_container(docker, definition, state_dir=Journal.folder().parent / "serve")
    echo(container_check_line(checked))
    return ExitCode.OK if checked.alive else ExitCode.ERROR


def show_drift(docker: Docker, definition: ImageDefinition, *, image: str | None, pin: Pin, json_out: bool) -> ExitCode:
    """`--diff`: the running container against the yaml; exit 7 on drift."""

    result = container_drift(docker, definition, image=image, pin=pin)
    if json_out:

        echo(json.dumps(drift_json(result), indent=2))
    else:
        for line in drift_lines(result, definition.name):
            echo(line)
    return ExitCode.DRIFT if result.drifts else ExitCode.OK


def start(docker: Docker, definition: ImageDefinition, *, image: str | None, replace: bool) -> ExitCode:
    """Lint the command against the image, run it, wait for /health."""
    _refuse_unfinished_deploys(definition.name, definition.serve)
    served = serve_definition(docker, definition, cache=cache_dir(), image=image, replace=replace, progress=progress)
    url = health_url(definition.serve.port, definition.serve.host) if definition.serve else ""
    for line in served_lines(served, url):
        echo(line)
    return ExitCode.OK


def _refuse_unfinished_deploys(name: str, serve: ServeConfig | None) -> None:
    """A deploy left unfinished (killed, or its rollback failed) on this container or port: starting a server
    there would put a container the journal does not know where its rollback acts. Its own lock refuses a
    running deploy; this refuses one that ended half-way."""

    if serve is None:
        return
    own = Journal.load(name)
    found = ([own] if own is not None and not own.phase.settled else []) + holders(name, serve.container.name, serve.port)
    for journal in found:
        raise VpatchError(f"a deploy of {journal.definition} is unfinished (phase {journal.phase.value}, started "
                          f"{journal.started}) on {journal.container} (port {journal.port}): a server started now "
                          "would stand where its rollback acts",
                          hint=f"`vpatch deploy {journal.definition} --status` shows where it stands; `vpatch deploy "
                          f"{journal.definition} --rollback` restores production")
