"""The `hosts:` list of images/<name>.yaml: the machines one image runs on, each with its docker endpoint, its
role (production, standby) and its overrides of the serve: section. No list: the local daemon, as before.

A config-layer module: it imports nothing but the config layer; connecting to an endpoint is the docker door's.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from vpatch.config.document import Document

_HOST_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
# docker's own rule for a context's name (cli/context/store: restrictedNamePattern).
_CONTEXT = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.+-]+$")


class HostRole(str, Enum):
    """What a host is for: production serves the lane; the standby serves it while production restarts."""

    PRODUCTION = "production"
    STANDBY = "standby"


class EndpointKind(str, Enum):
    SSH = "ssh"
    UNIX = "unix"
    TCP = "tcp"
    CONTEXT = "context"  # a docker context's name, resolved by `docker context inspect` when connecting


@dataclass(frozen=True)
class Endpoint:
    """A docker daemon as `hosts[].docker` names it."""

    kind: EndpointKind
    text: str  # as written: the URL, or the context's name

    @property
    def url(self) -> str | None:
        """The URL the docker SDK and CLI connect to; None for a context (resolved when connecting)."""
        return None if self.kind is EndpointKind.CONTEXT else self.text

    @property
    def context(self) -> str | None:
        return self.text if self.kind is EndpointKind.CONTEXT else None

    @property
    def cli_options(self) -> tuple[str, ...]:
        """What a docker CLI command line puts after `docker` to reach this daemon."""
        return ("--context", self.text) if self.kind is EndpointKind.CONTEXT else ("--host", self.text)

    @property
    def machine(self) -> str | None:
        """The machine the URL names (ssh://, tcp://); None for a local socket or a context."""
        if self.kind in (EndpointKind.SSH, EndpointKind.TCP):
            return urllib.parse.urlparse(self.text).hostname
        return None

    @classmethod
    def parse(cls, doc: Document, text: str, key: str) -> Endpoint:
        """ssh://[user@]host[:port], unix:///path, tcp://host[:port], or a docker context's name."""
        scheme, sep, _ = text.partition("://")
        if not sep:
            if not _CONTEXT.match(text):
                doc.fail(key, f"is {text!r}: not a docker endpoint (ssh://user@host, unix:///path, tcp://host:port) "
                         "nor a docker context's name (letters, digits, '_', '.', '+', '-')",
                         hint="`docker context ls` lists the contexts; or write the daemon's URL")
            return cls(EndpointKind.CONTEXT, text)
        try:
            kind = EndpointKind(scheme)
        except ValueError:
            kind = EndpointKind.CONTEXT
        if kind is EndpointKind.CONTEXT:
            doc.fail(key, f"is {text!r}: docker endpoints begin ssh://, unix:// or tcp://, not {scheme}://")
        parts = urllib.parse.urlparse(text)
        if kind is EndpointKind.UNIX:
            if parts.netloc or not parts.path.startswith("/") or parts.path == "/":
                doc.fail(key, f"is {text!r}: a socket is unix:// and its absolute path (unix:///var/run/docker.sock)")
            return cls(kind, text)
        try:
            port = parts.port
        except ValueError:
            doc.fail(key, f"is {text!r}: its port is not a number from 1 to 65535")
        if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.fragment or port == 0:
            doc.fail(key, f"is {text!r}: write {scheme}://{'user@' if kind is EndpointKind.SSH else ''}host[:port], "
                     "nothing after the host")
        return cls(kind, text)


@dataclass(frozen=True)
class Host:
    """One machine of the fleet."""

    name: str
    endpoint: Endpoint
    role: HostRole
    serve: Mapping[str, Any]  # its overrides of the serve: section, as read
    address: str | None = None  # where its server's port is reached from here (`address:`); None: see `reach`
    key: str = ""  # where the yaml gives it, e.g. hosts[1]

    @property
    def reach(self) -> str | None:
        """The machine vpatch reaches its server on: `address`, else the endpoint's machine; None: where the
        serve section says (the local daemon's servers)."""
        return self.address or self.endpoint.machine


def parse_hosts(doc: Document, value: Any) -> tuple[Host, ...]:
    """The `hosts:` list: names unique, one production, at most one standby, each endpoint well formed."""
    if not isinstance(value, list) or not value:
        doc.fail("hosts", f"must be a list of hosts (name, docker, role, serve), not {doc.shown(value)}",
                 hint="leave hosts: out to serve on the local docker daemon")
    hosts: list[Host] = []
    for i, item in enumerate(value):
        key = f"hosts[{i}]"
        data = doc.filled(item, key, required={"name", "docker", "role"}, optional={"serve", "address"})
        name = doc.text(data, "name", f"{key}.name")
        if not _HOST_NAME.match(name):
            doc.fail(f"{key}.name", f"is {name!r}: a host's name is lower-case letters, digits, '.', '_', '-'")
        role_text = doc.string(data, f"{key}.role")
        try:
            role = HostRole(role_text)
        except ValueError:
            doc.fail(f"{key}.role", f"must be production or standby, not {role_text!r}")
        serve = data.get("serve", {})
        if not isinstance(serve, dict) or ("serve" in data and not serve):
            # Its keys are the serve: section's, checked when the host's serve section is parsed (merged_serve).
            doc.fail(f"{key}.serve", f"is {doc.shown(serve)}: give the serve: keys this host runs otherwise, "
                     "or leave the key out")
        address = doc.optional_string(data, f"{key}.address")
        endpoint = Endpoint.parse(doc, doc.string(data, f"{key}.docker"), f"{key}.docker")
        for other in hosts:
            if other.name == name:
                doc.fail(f"{key}.name", f"is {name!r}, as {other.key}.name: each host needs a name of its own")
            if other.role is role:
                doc.fail(f"{key}.role", f"is {role.value}, as {other.key} ({other.name}) is: one host per role",
                         hint="give one host role production and the other role standby")
        hosts.append(Host(name, endpoint, role, dict(serve or {}), address, key))
    if not any(h.role is HostRole.PRODUCTION for h in hosts):
        doc.fail("hosts", "has no host with role production", hint="give the host that serves the lane role production")
    return tuple(hosts)


def merged_serve(serve: Mapping[str, Any] | None, overrides: Mapping[str, Any]) -> dict[str, Any] | None:
    """The serve: section as one host runs it: its overrides replace the section's keys, `container` and `env`
    key by key (the standby's one GPU, its KV budget, keep the rest)."""
    if serve is None and not overrides:
        return None
    out = dict(serve or {})
    for name, value in overrides.items():
        if name in ("container", "env") and isinstance(value, dict) and isinstance(out.get(name), dict):
            out[name] = {**out[name], **value}
        else:
            out[name] = value
    return out
