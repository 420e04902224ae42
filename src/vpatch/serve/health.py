"""A container's server from outside: wait until it is alive (serve and deploy), and why it is down when it is not.

The liveness rule itself is serve/alive.py (the container's own health check runs the same file).
"""

from __future__ import annotations

import re
import socket
import time

from vpatch.base import Progress, VpatchError
from vpatch.docker import Docker
from vpatch.serve import alive

# How often a wait reports while vLLM loads (the GPU host takes ~15 minutes).
_REPORT_EVERY_S = 15.0
# An exception line of a traceback, bare or in vLLM's log format: "(EngineCore pid=7) ERROR ... ] ValueError: ...".
_ERROR_LINE = re.compile(r"^(?:\(.*?\) )?(?:ERROR .*?\] )?([A-Z]\w*(?:Error|Exception): .+)$", re.M)


def base_url(port: int, host: str | None = None) -> str:
    return alive.base_url(port, host)


def refuse_taken_port(port: int, host: str | None, *, source: str) -> None:
    """Before a start: nothing may answer where the new server is to listen. Something that does would make
    the server fail on "Address already in use" while the health wait asks the other one (the audit's
    "healthy after 0s" for a server that died 30 s later)."""
    where = alive.url_host(host).strip("[]")
    try:
        with socket.create_connection((where, port), timeout=2.0):
            pass
    except OSError:
        return  # refused, unreachable, timed out: nothing listens there
    try:
        names = alive.served_models(base_url(port, host), timeout=3.0)
        said = f" (its /v1/models names {', '.join(map(repr, names)) or 'no model'})"
    except (alive.Unreachable, alive.HttpError, ValueError):
        said = " (not a vLLM server: it has no /v1/models)"
    raise VpatchError(f"something already listens on {where}:{port}{said}: a new server could not listen there, "
                      "and the health wait would ask that one",
                      hint=f"stop what listens on port {port} (`ss -ltnp 'sport = :{port}'` names it), or choose "
                      f"another serve.port in {source}")


def why_it_died(log: str) -> str:
    """The line that says why: the first exception the log names. Python prints a chain root cause first and
    vLLM's engine-core failure before the API server's "Engine core initialization failed. See root cause
    above"; a wrapper's message, the last one, only points back. Else the log's last line."""
    first = _ERROR_LINE.search(log)
    if first:
        return first[1].strip()[:400]
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    return lines[-1][:400] if lines else "(no output)"


def down(docker: Docker, container: str) -> str | None:
    """Why the container is not serving (gone, exited, restarting), or None while it runs."""
    info = docker.container(container)
    if info is None:
        return f"the container {container[:12]} is gone"
    if info.status in ("exited", "dead", "created"):
        return f"{info.name} exited with code {info.exit_code}: {why_it_died(docker.container_logs(container))}"
    if info.status == "restarting" or info.restart_count > 0:
        return (f"{info.name} is restarting (restart {info.restart_count}, exit code {info.exit_code}): "
                f"{why_it_died(docker.container_logs(container))}")
    return None


class NotAlive(VpatchError):
    """The server did not become alive: `why` is the one line that says why; the message adds the log's end."""

    def __init__(self, message: str, *, why: str, hint: str) -> None:
        super().__init__(message, hint=hint)
        self.why = why


def wait_alive(docker: Docker, container: str, url: str, *, timeout: float, progress: Progress | None = None,
               probe_timeout: float = 20.0, model: str | None = None,
               timeout_key: str = "serve.health_timeout") -> float:
    """Seconds until the server at `url` is alive by serve/alive.py's rule (/health 200 and a 1-token
    completion), from the server that serves `model` when given. Fails at once when the container exits or
    restarts (a crash loop is seen in seconds), and after `timeout` (the setting `timeout_key`); the error
    names the line that says why and carries the log's end. The container must still run once the answer
    came: an answer while it is gone came from someone else."""
    began = time.monotonic()
    last_report = began
    verdict: alive.Verdict | None = None
    while True:
        why = down(docker, container)
        if why is not None:
            raise _not_alive(docker, container, f"{why} (before {url} was alive)", why)
        verdict = alive.check(url, timeout=probe_timeout, model=model)
        if verdict.alive:
            why = down(docker, container)
            if why is not None:
                raise _not_alive(docker, container, f"{why} (while {url} answered: another server answers there)", why)
            return time.monotonic() - began
        now = time.monotonic()
        if now - began > timeout:
            raise _not_alive(docker, container, f"{url} was not alive within {timeout:.0f}s: {verdict.line()}",
                             verdict.line(), hint=f"raise {timeout_key} if the server needs longer to load")
        if progress and now - last_report >= _REPORT_EVERY_S:
            last_report = now
            progress(f"waiting for {url}: {now - began:.0f}s, {verdict.state}")
        time.sleep(1.0)


def _not_alive(docker: Docker, container: str, message: str, why: str, hint: str | None = None) -> NotAlive:
    info = docker.container(container)
    log = docker.container_logs(container) if info else ""
    tail = "\n".join(log.rstrip().splitlines()[-20:])
    name = info.name if info else container[:12]
    return NotAlive(message + (f"\nthe end of its log:\n{tail}" if tail else ""), why=why,
                    hint=hint or f"docker logs {name}")
