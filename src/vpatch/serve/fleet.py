"""The hosts an image runs on (images/<name>.yaml `hosts:`): each as the definition it runs there, its docker
daemon, and its drift from the definition. Without `hosts:` the fleet is the local daemon alone, as before."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass

from vpatch.base import Progress, host_state
from vpatch.config import Host, HostRole, ImageDefinition, Pin
from vpatch.docker import Docker
from vpatch.serve.drift import DriftReport, diff
from vpatch.serve.render import RunCommand, for_serve


@dataclass(frozen=True)
class FleetHost:
    """One host of the fleet: the definition as it runs there (its serve overrides applied)."""

    host: Host | None  # None: the local daemon of a definition without hosts:
    definition: ImageDefinition

    @property
    def name(self) -> str:
        return self.host.name if self.host is not None else "local"

    @property
    def role(self) -> HostRole:
        return self.host.role if self.host is not None else HostRole.PRODUCTION

    @property
    def daemon(self) -> tuple[str, ...]:
        """The docker CLI's options that reach this host's daemon."""
        return self.host.endpoint.cli_options if self.host is not None else ()

    @property
    def server_host(self) -> str | None:
        """The machine its server is reached on from here; None: where the serve section says (the local daemon)."""
        reach = self.host.reach if self.host is not None else None
        serve = self.definition.serve
        return reach if reach is not None else (serve.host if serve is not None else None)

    def state(self) -> AbstractContextManager[None]:
        """The block in which vpatch's state (journals, records, the locks of container names and ports) is this
        host's own: one lock per host, and its deploy journal beside no other host's."""
        return host_state(self.host.name if self.host is not None else None)

    def connect(self) -> Docker:
        """Its docker daemon, answering; a DockerError naming the host when it does not."""
        if self.host is None:
            return Docker.connect()
        endpoint = self.host.endpoint
        return Docker.connect(endpoint.url, context=endpoint.context, what=f"host {self.host.name}")

    def serve_command(self, image: str | None = None) -> RunCommand:
        """What `vpatch serve NAME --host H` runs there (and --print shows)."""
        return for_serve(self.definition, image=image, daemon=self.daemon)


def places(definition: ImageDefinition, only: str | None = None) -> list[FleetHost]:
    """The fleet in deploy order, the standby before production; `only`: that host alone (a ConfigError for a
    name the definition does not have)."""
    if only is not None:
        host = definition.host(only)
        return [FleetHost(host, definition.on_host(host))]
    if not definition.hosts:
        return [FleetHost(None, definition)]
    order = sorted(definition.hosts, key=lambda h: h.role is HostRole.PRODUCTION)
    return [FleetHost(h, definition.on_host(h)) for h in order]


def connect_all(fleet: list[FleetHost], progress: Progress | None = None) -> list[tuple[FleetHost, Docker]]:
    """Every host's daemon, before anything is touched on any: an unreachable one is an error first."""
    out = []
    for place in fleet:
        if progress and place.host is not None:
            progress(f"connecting to host {place.name} ({place.host.endpoint.text})")
        out.append((place, place.connect()))
    return out


@dataclass(frozen=True)
class HostDrift:
    """One host's container against the definition as that host runs it."""

    place: FleetHost
    container: str  # the container's name there
    report: DriftReport | None  # None: no such container on that host

    @property
    def clean(self) -> bool:
        return self.report is not None and not self.report.drifts


def fleet_drift(connected: list[tuple[FleetHost, Docker]], *, image: str | None, pin: Pin | None) -> list[HostDrift]:
    """`serve --diff` over the fleet: each host's container against its own serve section."""
    out = []
    for place, docker in connected:
        assert place.definition.serve is not None  # validated: serve --diff needs a serve section
        name = place.definition.serve.container.name
        found = docker.container(name) is not None
        out.append(HostDrift(place, name, diff(docker, place.definition, image=image, pin=pin) if found else None))
    return out
