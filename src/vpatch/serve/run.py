"""Start the server: lint first, then the rendered `docker run`, then wait until /health answers."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from vpatch.definition import ImageDefinition
from vpatch.errors import VpatchError
from vpatch.image.docker import Docker, DockerError
from vpatch.progress import Progress
from vpatch.serve import lint, render, runerror
from vpatch.serve.render import RunCommand

# How often the wait reports while vLLM loads (the GPU host takes ~15 minutes).
_REPORT_EVERY_S = 15.0


@dataclass(frozen=True)
class Served:
    command: RunCommand
    container_id: str
    lint: lint.LintReport
    seconds_to_healthy: float
    replaced: str | None  # id of the container that had the name before (--replace), if any


def health_url(port: int, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{port}/health"


def serve(docker: Docker, definition: ImageDefinition, *, cache: Path, image: str | None = None,
          replace: bool = False, progress: Progress | None = None) -> Served:
    """`vpatch serve NAME`: lint, then (only then) stop a container of the same name if `replace`, start
    the rendered command and wait for /health. A container with the name and no `replace` is refused."""
    command = render.for_definition(definition, image=image)
    assert definition.serve is not None  # for_definition refused a definition without serve:
    report = lint.check(docker, command, definition=definition.name, cache=cache, progress=progress)
    existing = docker.container(command.name)
    if existing is not None and not replace:
        raise VpatchError(
            f"a container named {command.name} exists ({existing.status}, image {existing.image_ref})",
            hint=f"vpatch serve {definition.name} --diff shows how it differs; --replace stops and replaces it; "
            f"vpatch deploy {definition.name} switches with checks and rollback",
        )
    if existing is not None:
        if progress:
            progress(f"removing the container {command.name} ({existing.id[:12]}, {existing.status})")
        docker.remove_container(existing.id)
    container_id = start(docker, command, progress=progress)
    try:
        seconds = wait_healthy(docker, container_id, health_url(definition.serve.port),
                               timeout=definition.serve.health_timeout, progress=progress)
    except VpatchError as exc:
        # A server that never became healthy must not stay in a restart loop (the incident's `vllm serve
        # serve` restarted every second for hours): keep it, with its log, stopped.
        docker.set_restart_policy(container_id, "no")
        docker.stop_container(container_id)
        raise VpatchError(exc.message, hint=f"{exc.hint}; the container is kept, stopped, restart policy no "
                          f"(docker rm -f {command.name})") from exc
    return Served(command, container_id, report, seconds, existing.id if existing else None)


def start(docker: Docker, command: RunCommand, *, progress: Progress | None = None) -> str:
    """Run the rendered `docker run` (the very argv --print shows) and return the container id."""
    if progress:
        progress(f"starting: {command.shell_line()}")
    try:
        return docker.run_cli(command.argv, timeout=300).out.strip()
    except DockerError as exc:
        raise runerror.explain(docker, command, exc) from exc  # names the yaml key; removes what it created


def wait_healthy(docker: Docker, container: str, url: str, *, timeout: float,
                 progress: Progress | None = None) -> float:
    """Seconds until GET `url` answered 200. Fails at once when the container exits or restarts (a crash
    loop is seen in seconds, not after the timeout), and after `timeout`; the error carries the log tail."""
    began = time.monotonic()
    last_report = began
    while True:
        info = docker.container(container)
        if info is None:
            raise VpatchError(f"container {container[:12]} is gone while waiting for {url}")
        if info.status in ("exited", "dead") or info.restart_count > 0 or info.status == "restarting":
            why = (f"exited with code {info.exit_code}" if info.status in ("exited", "dead")
                   else f"is restarting (restart {info.restart_count}, exit code {info.exit_code})")
            raise VpatchError(f"container {info.name} {why} before {url} answered" + _log_summary(docker, container),
                              hint=f"docker logs {info.name}")
        if _answers(url):
            return time.monotonic() - began
        now = time.monotonic()
        if now - began > timeout:
            raise VpatchError(f"{url} did not answer within {timeout:.0f}s" + _log_summary(docker, container),
                              hint="raise serve.health_timeout if the server needs longer to load")
        if progress and now - last_report >= _REPORT_EVERY_S:
            last_report = now
            progress(f"waiting for {url}: {now - began:.0f}s, container {info.status}")
        time.sleep(1.0)


# vLLM's root cause, as its own log line or a bare traceback line: "ValueError: No available memory ...".
_ERROR_LINE = re.compile(r"^(?:\(.*?\) ERROR .*?\] )?([A-Z]\w*(?:Error|Exception): .+)$", re.M)


def _log_summary(docker: Docker, container: str) -> str:
    """The first error the log names (vLLM's root cause comes before the generic ones), and the log's end."""
    log = docker.container_logs(container)
    first = _ERROR_LINE.search(log)
    tail = "\n".join(log.rstrip().splitlines()[-20:])
    return (f": {first[1]}" if first else "") + f"\nthe end of its log:\n{tail}"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False
