"""The container part of the docker door: throwaway runs in an image, and the containers serve and deploy
manage (inspect, logs, processes, restart policy, rename, stop, start, remove)."""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from vpatch.base import Output as RunResult
from vpatch.docker.daemon import Daemon, DockerError, daemon_call, output_tail
from vpatch.docker.images import inspect_image


@dataclass(frozen=True)
class ContainerMemory:
    """A running container's memory, in bytes, as `docker stats` reads it, and the part of it that is its
    processes' own."""

    used: int  # the cgroup's usage without its inactive page cache (what `docker stats` shows)
    limit: int  # its memory limit, the host's memory when it has none
    # Anonymous memory (cgroup v2 `anon`, v1 `total_rss`): `used` less the active page cache. On cgroup v1 a file's
    # pages count against the cgroup that read them first, so two containers of one image split the cache by the
    # order they ran in (a candidate that held 400 MiB more read +640-653 MiB over production, +398-404 MiB
    # resident, in the deploy report's server test). None: not reported.
    resident: int | None


@dataclass(frozen=True)
class ContainerInfo:
    """A container as `docker inspect` shows it: what it runs, how, and in which state."""

    id: str
    name: str
    image_id: str  # the image it was created from (sha256:...)
    image_ref: str  # the image as the `docker run` named it
    entrypoint: tuple[str, ...]
    args: tuple[str, ...]  # Config.Cmd: what followed the image in `docker run`
    env: tuple[str, ...]  # NAME=value, the image's defaults included
    labels: Mapping[str, str]
    status: str  # created | running | restarting | paused | exited | dead
    exit_code: int
    restart_count: int
    started_at: str
    restart_policy: str  # no | always | unless-stopped | on-failure[:N]
    network_mode: str
    ipc_mode: str
    shm_size: int  # bytes
    binds: tuple[str, ...]
    port_bindings: Mapping[str, tuple[str, ...]]  # "8000/tcp" -> ("8000",)
    gpus: tuple[str, ...]  # one entry per --gpus device request: "all", "4" or "device=0,1"
    health: str = ""  # starting | healthy | unhealthy; "" without a health check
    health_log: tuple[str, ...] = ()  # the health check's latest outputs, oldest first
    health_test: tuple[str, ...] = ()  # Config.Healthcheck.Test, e.g. ("CMD-SHELL", "python3 -c ...")
    # Config.Healthcheck's interval, timeout, retries and start period (seconds; docker keeps nanoseconds)
    health_timing: tuple[int, int, int, int] = (0, 0, 0, 0)
    memory_limit: int = 0  # HostConfig.Memory, bytes (docker --memory); 0 without a limit

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> ContainerInfo:
        config = attrs.get("Config") or {}
        host = attrs.get("HostConfig") or {}
        state = attrs.get("State") or {}
        policy = host.get("RestartPolicy") or {}
        restart = policy.get("Name") or "no"
        if restart == "on-failure" and policy.get("MaximumRetryCount"):
            restart = f"on-failure:{policy['MaximumRetryCount']}"
        gpus = []
        for request in host.get("DeviceRequests") or ():
            if request.get("DeviceIDs"):
                gpus.append("device=" + ",".join(request["DeviceIDs"]))
            else:
                gpus.append("all" if request.get("Count") == -1 else str(request.get("Count")))
        ports = {
            port: tuple(b.get("HostPort", "") for b in bindings or ())
            for port, bindings in (host.get("PortBindings") or {}).items()
        }
        return cls(
            id=attrs["Id"],
            name=str(attrs.get("Name", "")).lstrip("/"),
            image_id=attrs.get("Image", ""),
            image_ref=config.get("Image", ""),
            entrypoint=tuple(config.get("Entrypoint") or ()),
            args=tuple(config.get("Cmd") or ()),
            env=tuple(config.get("Env") or ()),
            labels=dict(config.get("Labels") or {}),
            status=state.get("Status", ""),
            exit_code=int(state.get("ExitCode") or 0),
            restart_count=int(attrs.get("RestartCount") or 0),
            started_at=state.get("StartedAt", ""),
            restart_policy=restart,
            network_mode=host.get("NetworkMode", ""),
            ipc_mode=host.get("IpcMode", ""),
            shm_size=int(host.get("ShmSize") or 0),
            binds=tuple(host.get("Binds") or ()),
            port_bindings=ports,
            gpus=tuple(gpus),
            health=str((state.get("Health") or {}).get("Status") or ""),
            health_log=tuple(str(e.get("Output", "")).strip() for e in (state.get("Health") or {}).get("Log") or ()),
            health_test=tuple((config.get("Healthcheck") or {}).get("Test") or ()),
            health_timing=_health_timing(config.get("Healthcheck") or {}),
            memory_limit=int(host.get("Memory") or 0),
        )


def _health_timing(check: Mapping[str, Any]) -> tuple[int, int, int, int]:
    def seconds(key: str) -> int:
        return int(check.get(key) or 0) // 1_000_000_000
    return seconds("Interval"), seconds("Timeout"), int(check.get("Retries") or 0), seconds("StartPeriod")


class Containers(Daemon):
    """What vpatch does with containers on the daemon."""

    # Throwaway runs

    def run(self, image: str, argv: Sequence[str], *, network: str = "none") -> bytes:
        """Run `argv` in a throwaway container of `image` (entrypoint replaced); its stdout, or DockerError."""
        result = self.execute(image, argv, network=network)
        if result.returncode != 0:
            raise DockerError(
                f"{' '.join(argv)} exited with {result.returncode} in {image}\n"
                + output_tail(result.err.splitlines() or result.out.splitlines())
            )
        return result.stdout

    def execute(
        self,
        image: str,
        argv: Sequence[str],
        *,
        network: str = "none",
        files: Mapping[str, bytes] | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> RunResult:
        """Run `argv` in a throwaway container of `image`, with `files` (absolute path -> bytes) put in first;
        returns its exit code and output (code 124 when it ran past `timeout`)."""
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status
        import requests  # lazy: requests (under the docker SDK) loads only when a daemon is used

        inspect_image(self.client, image)
        container = self.client.containers.create(
            image, entrypoint=list(argv[:1]), command=list(argv[1:]), network_mode=network, user="0",
            working_dir=workdir, environment=dict(env or {}),
        )
        try:
            if files:
                container.put_archive("/", _tar_of(files))
            container.start()
            try:
                code = int(container.wait(timeout=timeout).get("StatusCode", 1))
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):  # past `timeout`
                container.kill()
                code = 124
            stdout = bytes(container.logs(stdout=True, stderr=False))
            stderr = bytes(container.logs(stdout=False, stderr=True))
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot run {' '.join(argv)} in {image}: {exc.explanation or exc}") from exc
        finally:
            container.remove(force=True)
        return RunResult(code, stdout, stderr)

    # Managed containers

    @daemon_call
    def container(self, name: str) -> ContainerInfo | None:
        """The container `name` (or id) as docker inspect shows it; None when there is none."""
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

        try:
            return ContainerInfo.from_attrs(self.client.api.inspect_container(name))
        except dockersdk.errors.NotFound:
            return None
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot inspect container {name}: {exc.explanation or exc}") from exc

    @daemon_call
    def container_logs(self, name: str, *, tail: int | None = None, since: str | None = None) -> str:
        """The container's output so far (stdout and stderr interleaved); `tail`: only the last lines;
        `since`: only what it wrote from that RFC 3339 time on (e.g. its State.StartedAt: this run only)."""

        start = None
        if since:
            # Docker writes nanoseconds; Python's datetime takes microseconds.
            start = datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", since).replace("Z", "+00:00"))
        logs = self.client.api.logs(name, stdout=True, stderr=True, tail=tail if tail is not None else "all",
                                    since=start)
        return bytes(logs).decode("utf-8", "replace")

    @daemon_call
    def containers(self, *, label: str) -> list[ContainerInfo]:
        """Every container (running or not) carrying the label `label` ("key=value")."""
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

        try:
            found = self.client.api.containers(all=True, filters={"label": label})
            return [info for c in found if (info := self.container(c["Id"])) is not None]
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot list containers: {exc.explanation or exc}") from exc

    @daemon_call
    def processes(self, name: str) -> list[tuple[int, str]]:
        """(host pid, command line) of every process in the running container `name` (`docker top`)."""
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

        try:
            top = self.client.api.top(name)
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot list the processes of {name}: {exc.explanation or exc}") from exc
        titles = list(top.get("Titles") or [])
        pid, cmd = titles.index("PID"), titles.index("CMD")
        return [(int(row[pid]), str(row[cmd])) for row in top.get("Processes") or ()]

    @daemon_call
    def container_memory(self, name: str) -> ContainerMemory | None:
        """The running container `name`'s memory as `docker stats` shows it: the cgroup's usage without its
        inactive page cache (the kernel drops that first), against its memory limit (the host's memory when it
        has none), and the resident part. None when it is not running."""
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

        try:
            stats = self.client.api.stats(name, stream=False, one_shot=True)
        except dockersdk.errors.NotFound:
            return None
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot read the memory of {name}: {exc.explanation or exc}") from exc
        memory = stats.get("memory_stats") or {}
        if "usage" not in memory or not memory.get("limit"):
            return None  # a stopped container reports empty memory_stats
        detail = memory.get("stats") or {}
        # cgroup v2 calls it inactive_file, v1 total_inactive_file (docker's CLI subtracts the same).
        cache = detail.get("inactive_file", detail.get("total_inactive_file", 0))
        resident = detail.get("anon", detail.get("total_rss"))
        return ContainerMemory(int(memory["usage"]) - int(cache), int(memory["limit"]),
                               None if resident is None else int(resident))

    @daemon_call
    def remove_container(self, name: str) -> None:
        """Stop and delete the container `name` (nothing when there is none)."""
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

        try:
            self.client.api.remove_container(name, force=True)
        except dockersdk.errors.NotFound:
            pass

    @daemon_call
    def set_restart_policy(self, name: str, policy: str) -> None:
        """Change a container's restart policy (no | always | unless-stopped | on-failure[:N]) in place."""
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

        kind, _, retries = policy.partition(":")
        spec: dict[str, Any] = {"Name": kind}
        if retries:
            spec["MaximumRetryCount"] = int(retries)
        try:
            self.client.api.update_container(name, restart_policy=spec)
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot set the restart policy of {name} to {policy}: {exc.explanation or exc}") from exc

    @daemon_call
    def stop_container(self, name: str, *, timeout: int = 30) -> None:
        """Stop the container `name` (SIGTERM, SIGKILL after `timeout` seconds); kept, not deleted."""
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

        try:
            self.client.api.stop(name, timeout=timeout)
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot stop container {name}: {exc.explanation or exc}") from exc

    @daemon_call
    def rename_container(self, name: str, new_name: str) -> None:
        """Rename a container; it keeps its id, so deploy addresses a parked container by id."""
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

        try:
            self.client.api.rename(name, new_name)
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot rename container {name} to {new_name}: {exc.explanation or exc}") from exc

    @daemon_call
    def start_container(self, name: str) -> None:
        """Start an existing (stopped) container."""
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

        try:
            self.client.api.start(name)
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot start container {name}: {exc.explanation or exc}") from exc


def _tar_of(files: Mapping[str, bytes]) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for path, content in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(content), 0o644
            tar.addfile(info, io.BytesIO(content))
    return data.getvalue()
