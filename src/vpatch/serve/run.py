"""Start the server: lint first, then the rendered `docker run`, then wait until /health answers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vpatch.base import Progress, VpatchError, host_lock_folder, host_resources
from vpatch.config import ImageDefinition
from vpatch.docker import Docker, DockerError
from vpatch.serve import alive, health, lint, render, runerror
from vpatch.serve.fleet import FleetHost
from vpatch.serve.render import LABEL_DEFINITION, RunCommand


@dataclass(frozen=True)
class Served:
    command: RunCommand
    container_id: str
    lint: lint.LintReport
    seconds_to_healthy: float
    replaced: str | None  # id of the container that had the name before (--replace), if any


def health_url(port: int, host: str | None = None) -> str:
    return health.base_url(port, host)


def serve(docker: Docker, definition: ImageDefinition, *, cache: Path, image: str | None = None,
          replace: bool = False, progress: Progress | None = None, place: FleetHost | None = None) -> Served:
    """`vpatch serve NAME`: lint, then (only then) stop a container of the same name if `replace`, start
    the rendered command (restart `no`), wait for /health, then give it the yaml's restart policy. A container
    with the name and no `replace` is refused. `place`: the host of `hosts:` it runs on (`definition` as that
    host runs it), whose daemon `docker` is."""
    command = place.serve_command(image) if place is not None else render.for_serve(definition, image=image)
    assert definition.serve is not None  # for_serve refused a definition without serve:
    report = lint.check(docker, command, definition=definition.name, cache=cache, progress=progress)
    # The lock deploy, rollback and prune take on this container name and port: a serve --replace never
    # removes the candidate a deploy is checking.
    with host_resources(host_lock_folder(), container=command.name, port=definition.serve.port,
                        holder=f"vpatch serve {definition.name}"):
        return _serve(docker, definition, command, report, replace=replace, progress=progress,
                      server_host=place.server_host if place is not None else definition.serve.host)


def _serve(docker: Docker, definition: ImageDefinition, command: RunCommand, report: lint.LintReport, *,
           replace: bool, progress: Progress | None, server_host: str | None) -> Served:
    assert definition.serve is not None
    existing = docker.container(command.name)
    if existing is not None and not replace:
        raise VpatchError(
            f"a container named {command.name} exists ({existing.status}, image {existing.image_ref})",
            hint=f"vpatch serve {definition.name} --diff shows how it differs; --replace stops and replaces it; "
            f"vpatch deploy {definition.name} switches with checks and rollback",
        )
    if existing is not None:
        owner = existing.labels.get(LABEL_DEFINITION)
        if owner is not None and owner != definition.name:
            raise VpatchError(
                f"the container {command.name} ({existing.id[:12]}, {existing.status}) is labelled for the "
                f"definition {owner!r}, not {definition.name!r}: --replace removes only {definition.name}'s",
                hint=f"`vpatch serve {owner} ...` manages it; or give serve.container.name another name in "
                f"images/{definition.name}.yaml")
        if progress:
            progress(f"removing the container {command.name} ({existing.id[:12]}, {existing.status})")
        docker.remove_container(existing.id)
    serve_cfg = definition.serve
    health.refuse_taken_port(serve_cfg.port, server_host, source=f"images/{definition.name}.yaml")
    container_id = start(docker, command, progress=progress)
    try:
        seconds = health.wait_alive(docker, container_id, health_url(serve_cfg.port, server_host),
                                    timeout=serve_cfg.health_timeout, progress=progress, model=serve_cfg.model_name)
    except VpatchError as exc:
        # A server that never became healthy must not stay in a restart loop (the incident's `vllm serve
        # serve` restarted every second for hours): it was started with restart `no`, so docker never
        # restarted it; keep it, with its log, stopped.
        docker.stop_container(container_id)
        raise VpatchError(exc.message, hint=f"{exc.hint}; the container is kept, stopped, restart policy no "
                          f"(docker rm -f {command.name})") from exc
    if command.restart_once_alive is not None:
        docker.set_restart_policy(container_id, command.restart_once_alive)
        if progress:
            progress(f"{command.name} is alive: restart policy {command.restart_once_alive}")
    return Served(command, container_id, report, seconds, existing.id if existing else None)


def start(docker: Docker, command: RunCommand, *, progress: Progress | None = None) -> str:
    """Run the rendered `docker run` (the very argv --print shows) and return the container id."""
    if progress:
        progress(f"starting: {command.shell_line()}")
    try:
        return docker.run_cli(command.argv, timeout=300).out.strip()
    except DockerError as exc:
        raise runerror.explain(docker, command, exc) from exc  # names the yaml key; removes what it created


@dataclass(frozen=True)
class ContainerCheck:
    """`vpatch serve NAME --check`: the container's state, its own health check's, and the verdict from outside."""

    container: str
    status: str  # docker's: running, exited, ... ("absent" when there is none)
    docker_health: str  # what `docker ps` shows: healthy | unhealthy | starting | "" (no health check)
    verdict: alive.Verdict

    @property
    def alive(self) -> bool:
        return self.verdict.alive


def check(docker: Docker, definition: ImageDefinition, *, state_dir: Path,
          server_host: str | None = None) -> ContainerCheck:
    """The liveness verdict on the running container of `definition`, by the rule its health check runs;
    the stall memory between two checks (cron) lives in `state_dir`. `server_host`: the machine its server is
    reached on (a host of `hosts:`); None: where the serve section says."""
    assert definition.serve is not None
    name = definition.serve.container.name
    info = docker.container(name)
    if info is None:
        return ContainerCheck(name, "absent", "", alive.Verdict("down", f"no container named {name}", 0.0))
    why = health.down(docker, info.id)
    if why is not None:
        return ContainerCheck(name, info.status, info.health, alive.Verdict("down", why, 0.0))
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        state: str | None = str(state_dir / f"{definition.name}-alive.json")
    except OSError:
        state = None  # a read-only or broken state folder loses the stall memory between checks, not the verdict
    verdict = alive.check(health_url(definition.serve.port, server_host or definition.serve.host), model=definition.serve.model_name,
                          timeout=render.PROBE_TIMEOUT_S, stall_s=render.STALL_S,
                          state=state)
    return ContainerCheck(name, info.status, info.health, verdict)
