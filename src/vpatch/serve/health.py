"""A container's server from outside: wait until it is alive (serve and deploy), and why it is down when it is not.

The liveness rule itself is serve/alive.py (the container's own health check runs the same file).
"""

from __future__ import annotations

import re
import time

from vpatch.docker import Docker
from vpatch.errors import VpatchError
from vpatch.progress import Progress
from vpatch.serve import alive

# How often a wait reports while vLLM loads (the GPU host takes ~15 minutes).
_REPORT_EVERY_S = 15.0
# An exception line of a traceback, bare or in vLLM's log format: "(EngineCore pid=7) ERROR ... ] ValueError: ...".
_ERROR_LINE = re.compile(r"^(?:\(.*?\) )?(?:ERROR .*?\] )?([A-Z]\w*(?:Error|Exception): .+)$", re.M)


def base_url(port: int, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{port}"


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
               probe_timeout: float = 20.0) -> float:
    """Seconds until the server at `url` is alive by serve/alive.py's rule (/health 200 and a 1-token
    completion). Fails at once when the container exits or restarts (a crash loop is seen in seconds), and
    after `timeout`; the error names the line that says why and carries the log's end."""
    began = time.monotonic()
    last_report = began
    verdict: alive.Verdict | None = None
    while True:
        why = down(docker, container)
        if why is not None:
            raise _not_alive(docker, container, f"{why} (before {url} was alive)", why)
        verdict = alive.check(url, timeout=probe_timeout)
        if verdict.alive:
            return time.monotonic() - began
        now = time.monotonic()
        if now - began > timeout:
            raise _not_alive(docker, container, f"{url} was not alive within {timeout:.0f}s: {verdict.line()}",
                             verdict.line(), hint="raise serve.health_timeout if the server needs longer to load")
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
