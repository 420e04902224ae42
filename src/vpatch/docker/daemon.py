"""The connection to the docker daemon, the errors it raises, and the docker CLI where a command line is the product."""

from __future__ import annotations

import functools
import shlex
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, ParamSpec, Self, TypeVar

from vpatch.base import Output as RunResult
from vpatch.base import ProcessError, VpatchError, run_process

if TYPE_CHECKING:
    import docker as dockersdk

# How many lines of a failing step's output an error carries.
TAIL_LINES = 40


class DockerError(VpatchError):
    """The docker daemon is unreachable, an image is missing, or a build, run or push failed."""


class DaemonGone(DockerError):
    """The daemon stopped answering mid-way (restarting, stopped): a caller may wait for it and retry."""


_P = ParamSpec("_P")
_R = TypeVar("_R")


def daemon_call(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A container call whose connection to the daemon is refused or reset raises DaemonGone (not the
    HTTP library's own error: a restarting daemon is a state the deploy recovers from)."""
    @functools.wraps(method)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        import requests  # lazy: requests (under the docker SDK) loads only when a daemon is used

        try:
            return method(*args, **kwargs)
        except requests.exceptions.ConnectionError as exc:
            raise DaemonGone(f"the docker daemon did not answer: {exc}",
                             hint="is dockerd restarting? `systemctl status docker` / `docker info`") from exc
    return call


def context_url(context: str, *, what: str = "") -> str:
    """The endpoint the docker context `context` names (`docker context inspect`), e.g. ssh://ops@gpu-2."""
    who = f"{what}: " if what else ""
    try:
        found = run_process(["docker", "context", "inspect", "--format", "{{.Endpoints.docker.Host}}", context],
                            check=False)
    except ProcessError as exc:
        raise DockerError(f"{who}cannot read the docker context {context!r}: {exc.message}",
                          hint="install the docker CLI (docker.io), which keeps the contexts") from exc
    url = found.out.strip()
    if found.returncode != 0 or not url:
        raise DockerError(f"{who}no docker context {context!r} ({(found.err or found.out).strip()[:200]})",
                          hint="`docker context ls` lists them; `docker context create NAME --docker host=URL` adds one")
    return url


def output_tail(lines: Iterable[str]) -> str:
    """The last TAIL_LINES of a failing command's output, as one text for an error."""
    return "\n".join(deque((ln.rstrip("\n") for ln in lines), maxlen=TAIL_LINES))


class Daemon:
    """A connection to one docker daemon; the image and container parts add their methods to it."""

    def __init__(self, client: dockersdk.DockerClient) -> None:
        self.client = client

    @classmethod
    def connect(cls, url: str | None = None, *, context: str | None = None, what: str = "") -> Self:
        """Connect to the daemon at `url` (ssh://user@host[:port] through the ssh binary and its config, unix://,
        tcp://), the docker context `context`, or else the one DOCKER_HOST names (default: the local socket), and
        check it answers. `what` names it in the error (e.g. "host standby")."""
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

        if context is not None:
            url = context_url(context, what=what)
        where = f"{what} ({url})" if what and url else (what or url or "")
        try:
            if url is None:
                client = dockersdk.from_env()
            else:
                # ssh:// through the ssh binary: the user's ssh config (keys, aliases, known hosts) applies, as it
                # does to the docker CLI; paramiko would read only ~/.ssh/config.
                client = dockersdk.DockerClient(base_url=url, use_ssh_client=url.startswith("ssh://"))
            client.ping()
        except dockersdk.errors.DockerException as exc:
            if where:
                raise DockerError(f"the docker daemon of {where} is not reachable ({exc})",
                                  hint="is the machine up, its dockerd running and (for ssh://) `ssh` to it working "
                                  "without a password?") from exc
            raise DockerError(
                f"the docker daemon is not running or not reachable ({exc})",
                hint="start it (scripts/start-dockerd, or `dockerd` as root) or set DOCKER_HOST",
            ) from exc
        return cls(client)

    def run_cli(self, argv: Sequence[str], *, timeout: float | None = None) -> RunResult:
        """Run a docker CLI command given as argv (argv[0] is the docker executable) against this daemon.

        For commands whose exact command line is the product (`vpatch serve --print` shows it, and
        this runs that very argv); DockerError with the command, exit code and output on failure."""

        try:
            result = run_process(argv, timeout=timeout, check=False)
        except ProcessError as exc:
            if exc.timed_out:
                raise DockerError(f"{shlex.join(argv)} did not finish within {timeout:.0f}s") from exc
            if isinstance(exc.__cause__, FileNotFoundError):
                raise DockerError(f"the docker CLI ({argv[0]}) is not installed", hint="install docker.io") from exc
            raise DockerError(exc.message, hint=exc.hint) from exc  # e.g. an argument list too long
        if result.returncode != 0:
            raise DockerError(
                f"{shlex.join(argv)} failed with exit code {result.returncode}\n"
                + output_tail((result.err or result.out).splitlines())
            )
        return result
