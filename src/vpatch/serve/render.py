"""The exact `docker run` command for a serve configuration and an image: what --print shows is what runs."""

from __future__ import annotations

import base64
import shlex
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from vpatch.base import ConfigError
from vpatch.config import ServeConfig
from vpatch.serve import alive

if TYPE_CHECKING:
    from vpatch.config import ImageDefinition

# Labels every container vpatch starts carries: which image definition it serves, so that drift and
# deploy can tell vpatch's containers from others.
LABEL_DEFINITION = "io.vpatch.serve.definition"
# A deploy's candidate also carries its deploy's id (the journal's `started`): a rollback stops and renames
# only the container that carries it, never one that took the production name in the meantime.
LABEL_DEPLOY = "io.vpatch.deploy"
# The container's health check: serve/alive.py run by the image's python3 every HEALTH_INTERVAL_S; a
# 1-token completion gets PROBE_TIMEOUT_S; HEALTH_RETRIES failures in a row make `docker ps` say unhealthy.
HEALTH_INTERVAL_S = 10
PROBE_TIMEOUT_S = 15
HEALTH_RETRIES = 3
STALL_S = 30
HEALTH_STATE = "/tmp/vpatch-alive.json"


def health_command(port: int, host: str | None = None, model: str | None = None) -> str:
    """The shell line docker runs as the health check: the liveness rule's own source, given to python3 -c.

    The source travels compressed and base64-encoded on one line, so that `serve --print` (and `docker
    inspect`) stay readable and no quoting of the file's text can go wrong; `health_source` reads it back."""

    source = Path(alive.__file__).read_text(encoding="utf-8")
    blob = base64.b64encode(zlib.compress(source.encode("utf-8"), 9)).decode("ascii")
    return shlex.join(["python3", "-c", f'{_UNPACK}"{blob}")))', alive.base_url(port, host), "--timeout",
                       str(PROBE_TIMEOUT_S), "--stall-s", str(STALL_S), "--state", HEALTH_STATE,
                       *(["--model", model] if model else [])])


_UNPACK = "import base64,zlib;exec(zlib.decompress(base64.b64decode("


@dataclass(frozen=True)
class HealthCheck:
    """The container health check `vpatch serve` gives a server: the command and docker's four timings."""

    command: str
    interval_s: int
    timeout_s: int
    retries: int
    start_period_s: int

    def docker_options(self) -> list[str]:
        return ["--health-cmd", self.command, "--health-interval", f"{self.interval_s}s",
                "--health-timeout", f"{self.timeout_s}s", "--health-retries", str(self.retries),
                "--health-start-period", f"{self.start_period_s}s"]


def health_check(serve: ServeConfig) -> HealthCheck:
    # The start period is the time the server may take to load; failures before its first success do not count.
    # The served model too: on a host-network port another server could answer /health for this one.
    return HealthCheck(health_command(serve.port, serve.host, serve.model_name), HEALTH_INTERVAL_S, PROBE_TIMEOUT_S + 15,
                       HEALTH_RETRIES, int(serve.health_timeout))


def health_source(command: str) -> str | None:
    """The liveness script a rendered health check runs (None when `command` is not one of vpatch's)."""
    words = shlex.split(command)
    if len(words) < 3 or words[:2] != ["python3", "-c"] or not words[2].startswith(_UNPACK):
        return None
    return zlib.decompress(base64.b64decode(words[2][len(_UNPACK):].strip("\")"))).decode("utf-8")


@dataclass(frozen=True)
class RunCommand:
    """A `docker run` as argv, with the parts other code needs without re-parsing it."""

    argv: tuple[str, ...]  # docker run ... IMAGE ARGS...
    image: str  # the image reference as given
    name: str  # the container's name
    args: tuple[str, ...]  # what follows the image: the container's command (after the image's entrypoint)
    # The restart policy the container is given once it is alive (None: it keeps the one it was started with).
    restart_once_alive: str | None = None
    daemon: tuple[str, ...] = ()  # the docker CLI's options that reach the host's daemon (--host URL, --context NAME)

    def shell_line(self) -> str:
        """The command shell-quoted, one line, as an operator would paste it."""
        return shlex.join(self.argv)

    def shell_lines(self) -> list[str]:
        """The run and, when it has one, the update that gives the restart policy once the server is alive."""
        if self.restart_once_alive is None:
            return [self.shell_line()]
        update = shlex.join([self.argv[0], *self.daemon, "update", "--restart", self.restart_once_alive, self.name])
        return [self.shell_line(), f"{update}   # once alive"]


def render(
    serve: ServeConfig,
    image: str,
    *,
    definition: str,
    name: str | None = None,
    restart: str | None = None,
    docker: str = "docker",
    labels: dict[str, str] | None = None,
    daemon: tuple[str, ...] = (),
) -> RunCommand:
    """The `docker run` that starts `serve` from `image` (detached).

    `definition` is the image definition's name (stamped as a label); `name` and `restart` override the
    yaml's container name and restart policy (deploy starts a candidate under another name, or with
    restart `no` until it passed its checks); `docker` is the CLI executable, `daemon` its options that reach
    another host's daemon.
    """
    options = serve.container
    if name is not None:
        options = replace(options, name=name)
    if restart is not None:
        options = replace(options, restart=restart)
    argv: list[str] = [docker, *daemon, "run", "--detach", "--name", options.name,
                       "--label", f"{LABEL_DEFINITION}={definition}", "--restart", options.restart]
    for key, value in (labels or {}).items():
        argv[-2:-2] = ["--label", f"{key}={value}"]
    if options.gpus is not None:
        # The CLI reads --gpus as CSV: a device list with commas has to be one quoted field.
        argv += ["--gpus", f'"{options.gpus}"' if "," in options.gpus else options.gpus]
    if options.ipc is not None:
        argv += ["--ipc", options.ipc]
    if options.shm_size is not None:
        argv += ["--shm-size", options.shm_size]
    if options.memory is not None:
        argv += ["--memory", options.memory]
    if options.network is not None:
        argv += ["--network", options.network]
    if options.network != "host":
        argv += ["--publish", f"{serve.port}:{serve.port}"]
    for volume in options.volumes:
        argv += ["--volume", volume]
    for key, value in serve.env:
        argv += ["--env", f"{key}={value}"]
    argv += health_check(serve).docker_options()
    args = serve.vllm_args()
    argv += [image, *args]
    return RunCommand(argv=tuple(argv), image=image, name=options.name, args=args, daemon=daemon)


def for_definition(definition: ImageDefinition, *, image: str | None = None, name: str | None = None,
                   restart: str | None = None, daemon: tuple[str, ...] = ()) -> RunCommand:
    """The `docker run` for images/<name>.yaml's serve section: its moving tag unless `image` is given."""
    if definition.serve is None:
        raise ConfigError(
            f"images/{definition.name}.yaml has no serve: section",
            hint=f"add serve: (model, vLLM arguments, container options) to images/{definition.name}.yaml; "
            "see the README's serve section",
        )
    return render(definition.serve, image or definition.moving_ref, definition=definition.name, name=name,
                  restart=restart, daemon=daemon)


def for_serve(definition: ImageDefinition, *, image: str | None = None, daemon: tuple[str, ...] = ()) -> RunCommand:
    """What `vpatch serve NAME` runs: the yaml's `docker run` with restart `no`, the yaml's policy given once alive.

    A container gets its restart policy only once it is alive (deploy's candidate gets it once it passed): a
    server that dies at start is one start, never restarted by docker (the incident's lane restarted every
    second for hours, and each start of a real server loads its weights again)."""
    command = for_definition(definition, image=image, restart="no", daemon=daemon)
    assert definition.serve is not None  # for_definition refused a definition without serve:
    policy = definition.serve.container.restart
    return replace(command, restart_once_alive=None if policy == "no" else policy)
