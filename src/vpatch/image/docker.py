"""The one door to docker: the docker SDK for everything it can do, the docker CLI for BuildKit builds."""

from __future__ import annotations

import functools
import io
import os
import re
import tarfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any, ParamSpec, TypeVar

from vpatch import process
from vpatch.errors import ProcessError, VpatchError
from vpatch.process import Output as RunResult
from vpatch.progress import Progress

if TYPE_CHECKING:
    import docker as dockersdk

# How many lines of a failing step's output an error carries.
_TAIL_LINES = 40


class DockerError(VpatchError):
    """The docker daemon is unreachable, an image is missing, or a build, run or push failed."""


class DaemonGone(DockerError):
    """The daemon stopped answering mid-way (restarting, stopped): a caller may wait for it and retry."""


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _daemon_call(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A container call whose connection to the daemon is refused or reset raises DaemonGone (not the
    HTTP library's own error: a restarting daemon is a state the deploy recovers from)."""
    @functools.wraps(method)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        import requests

        try:
            return method(*args, **kwargs)
        except requests.exceptions.ConnectionError as exc:
            raise DaemonGone(f"the docker daemon did not answer: {exc}",
                             hint="is dockerd restarting? `systemctl status docker` / `docker info`") from exc
    return call


SYMLINK = "120000"


@dataclass(frozen=True)
class FileEntry:
    """A file in an image as git records one: mode 100644, 100755 or 120000 (a symlink; data is its target)."""

    mode: str
    data: bytes


@dataclass(frozen=True)
class ImageInfo:
    id: str
    tags: tuple[str, ...]
    repo_digests: tuple[str, ...]
    labels: Mapping[str, str]
    size: int
    entrypoint: tuple[str, ...] = ()  # Config.Entrypoint: what `docker run IMAGE ARGS...` puts before ARGS
    cmd: tuple[str, ...] = ()  # Config.Cmd: the default ARGS
    env: tuple[str, ...] = ()  # Config.Env: NAME=value lines every container of the image starts with

    @property
    def digest(self) -> str | None:
        """The registry digest (sha256:...) the image was pulled or pushed with, if any."""
        for ref in self.repo_digests:
            if "@" in ref:
                return ref.split("@", 1)[1]
        return None


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
        )


@dataclass(frozen=True)
class Layer:
    created_by: str
    size: int


@dataclass(frozen=True)
class BuildKitInvocation:
    """A BuildKit build as the docker CLI runs it: argv plus the environment it needs."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)

    def shell_line(self) -> str:
        import shlex

        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (prefix + " " if prefix else "") + shlex.join(self.argv)


def split_ref(ref: str) -> tuple[str, str]:
    """registry:5000/repo/name:tag -> (registry:5000/repo/name, tag); no tag means latest."""
    if ":" in ref.rsplit("/", 1)[-1]:
        repository, _, tag = ref.rpartition(":")
        return repository, tag
    return ref, "latest"


def _tail(lines: Iterable[str]) -> str:
    return "\n".join(deque((ln.rstrip("\n") for ln in lines), maxlen=_TAIL_LINES))


class Docker:
    """A connection to one docker daemon, with methods named by what vpatch needs from it."""

    def __init__(self, client: dockersdk.DockerClient) -> None:
        self.client = client

    @classmethod
    def connect(cls) -> Docker:
        """Connect to the daemon named by DOCKER_HOST (default: the local socket) and check it answers."""
        import docker as dockersdk

        try:
            client = dockersdk.from_env()
            client.ping()
        except dockersdk.errors.DockerException as exc:
            raise DockerError(
                f"the docker daemon is not running or not reachable ({exc})",
                hint="start it (scripts/start-dockerd, or `dockerd` as root) or set DOCKER_HOST",
            ) from exc
        return cls(client)

    # Images

    def image(self, ref: str, *, missing_hint: str | None = None) -> ImageInfo:
        """The image `ref` names on the daemon; DockerError (with `missing_hint`) when there is none."""
        import docker as dockersdk

        if not ref.strip():
            # The SDK would raise NullResource (not an APIError) for "": no image is named at all.
            raise DockerError(f"no image named ({ref!r} is empty)", hint="name an image by tag or id (`docker images`)")
        try:
            attrs = self.client.api.inspect_image(ref)
        except dockersdk.errors.ImageNotFound as exc:
            raise DockerError(
                f"image {ref} is not on the docker daemon",
                hint=missing_hint or f"pull it (`docker pull {ref}`) or check the name (`docker images`)",
            ) from exc
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot inspect image {ref}: {exc.explanation or exc}") from exc
        config = attrs.get("Config") or {}
        return ImageInfo(
            id=attrs["Id"],
            tags=tuple(attrs.get("RepoTags") or ()),
            repo_digests=tuple(attrs.get("RepoDigests") or ()),
            labels=dict(config.get("Labels") or {}),
            size=int(attrs.get("Size") or 0),
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
            env=tuple(config.get("Env") or ()),
        )

    def has_image(self, ref: str) -> bool:
        import docker as dockersdk

        try:
            self.client.api.inspect_image(ref)
        except dockersdk.errors.ImageNotFound:
            return False
        return True

    def history(self, ref: str) -> list[Layer]:
        """The image's layers, newest first, with the instruction that made each and its size."""
        return [Layer(h.get("CreatedBy", ""), int(h.get("Size", 0))) for h in self.client.api.history(ref)]

    def tag(self, image: str, ref: str) -> None:
        repository, tag = split_ref(ref)
        self.client.api.tag(image, repository, tag, force=True)

    def remove_image(self, ref: str) -> None:
        import docker as dockersdk

        try:
            self.client.api.remove_image(ref, force=True)
        except dockersdk.errors.ImageNotFound:
            pass

    def import_rootfs(self, rootfs_tar: IO[bytes], ref: str, changes: Sequence[str] = ()) -> str:
        """Make an image of one layer from a root filesystem tarball (as `docker import`); returns its id."""
        repository, tag = split_ref(ref)
        self.client.api.import_image_from_data(
            rootfs_tar.read(), repository=repository, tag=tag, changes=list(changes) or None
        )
        return self.image(ref).id

    # Containers

    def run(self, image: str, argv: Sequence[str], *, network: str = "none") -> bytes:
        """Run `argv` in a throwaway container of `image` (entrypoint replaced); its stdout, or DockerError."""
        result = self.execute(image, argv, network=network)
        if result.returncode != 0:
            raise DockerError(
                f"{' '.join(argv)} exited with {result.returncode} in {image}\n"
                + _tail(result.err.splitlines() or result.out.splitlines())
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
        import docker as dockersdk
        import requests

        self.image(image)
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

    def read_files(self, image: str, paths: Sequence[str]) -> dict[str, bytes | None]:
        """Contents of absolute `paths` inside `image` (None: absent, or not a regular file)."""
        return {path: e.data if e is not None and e.mode != SYMLINK else None
                for path, e in self.read_entries(image, paths).items()}

    def read_entries(self, image: str, paths: Sequence[str]) -> dict[str, FileEntry | None]:
        """Each of the absolute `paths` inside `image` as git would record it (None: absent, or neither a
        regular file nor a symlink), read without starting a container."""
        import docker as dockersdk

        self.image(image)
        # A created, never-started container exposes the image's filesystem; nothing runs and no layer is kept.
        container = self.client.api.create_container(image, command=["true"], network_disabled=True)
        found: dict[str, FileEntry | None] = {}
        try:
            for path in paths:
                try:
                    stream, _stat = self.client.api.get_archive(container["Id"], path)
                except dockersdk.errors.NotFound:
                    found[path] = None
                    continue
                found[path] = _single_entry(b"".join(stream))
        finally:
            self.client.api.remove_container(container["Id"], force=True)
        return found

    def list_dir(self, image: str, path: str) -> list[str]:
        """Names of the entries directly inside folder `path` of `image` ([] when it does not exist)."""
        import docker as dockersdk

        container = self.client.api.create_container(image, command=["true"], network_disabled=True)
        try:
            try:
                stream, _stat = self.client.api.get_archive(container["Id"], path)
            except dockersdk.errors.NotFound:
                return []
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                return sorted({PurePosixPath(m.name).parts[1] for m in tar.getmembers() if len(PurePosixPath(m.name).parts) > 1})
        finally:
            self.client.api.remove_container(container["Id"], force=True)

    @_daemon_call
    def container(self, name: str) -> ContainerInfo | None:
        """The container `name` (or id) as docker inspect shows it; None when there is none."""
        import docker as dockersdk

        try:
            return ContainerInfo.from_attrs(self.client.api.inspect_container(name))
        except dockersdk.errors.NotFound:
            return None
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot inspect container {name}: {exc.explanation or exc}") from exc

    @_daemon_call
    def container_logs(self, name: str, *, tail: int | None = None, since: str | None = None) -> str:
        """The container's output so far (stdout and stderr interleaved); `tail`: only the last lines;
        `since`: only what it wrote from that RFC 3339 time on (e.g. its State.StartedAt: this run only)."""
        from datetime import datetime

        start = None
        if since:
            # Docker writes nanoseconds; Python's datetime takes microseconds.
            start = datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", since).replace("Z", "+00:00"))
        logs = self.client.api.logs(name, stdout=True, stderr=True, tail=tail if tail is not None else "all",
                                    since=start)
        return bytes(logs).decode("utf-8", "replace")

    @_daemon_call
    def containers(self, *, label: str) -> list[ContainerInfo]:
        """Every container (running or not) carrying the label `label` ("key=value")."""
        import docker as dockersdk

        try:
            found = self.client.api.containers(all=True, filters={"label": label})
            return [info for c in found if (info := self.container(c["Id"])) is not None]
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot list containers: {exc.explanation or exc}") from exc

    @_daemon_call
    def processes(self, name: str) -> list[tuple[int, str]]:
        """(host pid, command line) of every process in the running container `name` (`docker top`)."""
        import docker as dockersdk

        try:
            top = self.client.api.top(name)
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot list the processes of {name}: {exc.explanation or exc}") from exc
        titles = list(top.get("Titles") or [])
        pid, cmd = titles.index("PID"), titles.index("CMD")
        return [(int(row[pid]), str(row[cmd])) for row in top.get("Processes") or ()]

    @_daemon_call
    def remove_container(self, name: str) -> None:
        """Stop and delete the container `name` (nothing when there is none)."""
        import docker as dockersdk

        try:
            self.client.api.remove_container(name, force=True)
        except dockersdk.errors.NotFound:
            pass

    @_daemon_call
    def set_restart_policy(self, name: str, policy: str) -> None:
        """Change a container's restart policy (no | always | unless-stopped | on-failure[:N]) in place."""
        import docker as dockersdk

        kind, _, retries = policy.partition(":")
        spec: dict[str, Any] = {"Name": kind}
        if retries:
            spec["MaximumRetryCount"] = int(retries)
        try:
            self.client.api.update_container(name, restart_policy=spec)
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot set the restart policy of {name} to {policy}: {exc.explanation or exc}") from exc

    @_daemon_call
    def stop_container(self, name: str, *, timeout: int = 30) -> None:
        """Stop the container `name` (SIGTERM, SIGKILL after `timeout` seconds); kept, not deleted."""
        import docker as dockersdk

        try:
            self.client.api.stop(name, timeout=timeout)
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot stop container {name}: {exc.explanation or exc}") from exc

    @_daemon_call
    def rename_container(self, name: str, new_name: str) -> None:
        """Rename a container; it keeps its id, so deploy addresses a parked container by id."""
        import docker as dockersdk

        try:
            self.client.api.rename(name, new_name)
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot rename container {name} to {new_name}: {exc.explanation or exc}") from exc

    @_daemon_call
    def start_container(self, name: str) -> None:
        """Start an existing (stopped) container."""
        import docker as dockersdk

        try:
            self.client.api.start(name)
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"cannot start container {name}: {exc.explanation or exc}") from exc

    def run_cli(self, argv: Sequence[str], *, timeout: float | None = None) -> RunResult:
        """Run a docker CLI command given as argv (argv[0] is the docker executable) against this daemon.

        For commands whose exact command line is the product (`vpatch serve --print` shows it, and
        this runs that very argv); DockerError with the command, exit code and output on failure."""
        import shlex

        try:
            result = process.run(argv, timeout=timeout, check=False)
        except ProcessError as exc:
            if exc.timed_out:
                raise DockerError(f"{shlex.join(argv)} did not finish within {timeout:.0f}s") from exc
            if isinstance(exc.__cause__, FileNotFoundError):
                raise DockerError(f"the docker CLI ({argv[0]}) is not installed", hint="install docker.io") from exc
            raise DockerError(exc.message, hint=exc.hint) from exc  # e.g. an argument list too long
        if result.returncode != 0:
            raise DockerError(
                f"{shlex.join(argv)} failed with exit code {result.returncode}\n"
                + _tail((result.err or result.out).splitlines())
            )
        return result

    # Builds

    def build(
        self,
        context: Path,
        *,
        tag: str,
        buildargs: Mapping[str, str],
        labels: Mapping[str, str],
        dockerfile: str = "Dockerfile",
        progress: Progress | None = None,
    ) -> str:
        """Build with the daemon's classic builder through the SDK, streaming each line; returns the image id."""
        import docker as dockersdk

        recent: deque[str] = deque(maxlen=_TAIL_LINES)
        image_id: str | None = None
        try:
            stream = self.client.api.build(
                path=str(context),
                dockerfile=dockerfile,
                tag=tag,
                buildargs=dict(buildargs),
                labels=dict(labels),
                network_mode="none",
                rm=True,
                forcerm=True,
                decode=True,
            )
            for chunk in stream:
                if "error" in chunk:
                    raise DockerError(
                        f"docker build of {tag} failed: {chunk['error'].strip()}\n"
                        f"output of the failing step:\n{_tail(recent)}"
                    )
                if "stream" in chunk:
                    for line in chunk["stream"].splitlines():
                        if line.strip():
                            recent.append(line)
                            if line.startswith("Step "):
                                recent.clear()
                                recent.append(line)
                            if progress:
                                progress(line)
                if "aux" in chunk and "ID" in chunk["aux"]:
                    image_id = chunk["aux"]["ID"]
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"docker build of {tag} failed: {exc.explanation or exc}") from exc
        return image_id or self.image(tag).id

    def run_buildkit(self, invocation: BuildKitInvocation, progress: Progress | None = None) -> None:
        """Run a BuildKit build through the docker CLI, streaming its output; DockerError with the tail on failure."""
        def on_line(line: str) -> None:
            if progress:
                progress(line)

        try:
            result = process.stream(invocation.argv, on_line, env=invocation.env, check=False)
        except ProcessError as exc:
            raise DockerError("the docker CLI cannot run: " + exc.message, hint="install docker.io") from exc
        if result.returncode != 0:
            raise DockerError(
                f"BuildKit build failed with exit code {result.returncode}: {invocation.shell_line()}\n"
                f"output of the failing step:\n{_tail(result.out.splitlines())}"
            )

    # Registries

    def push(self, ref: str, progress: Progress | None = None) -> str | None:
        """Push `ref` to its registry; returns the pushed manifest digest."""
        import docker as dockersdk

        repository, tag = split_ref(ref)
        digest: str | None = None
        try:
            for chunk in self.client.api.push(repository, tag=tag, stream=True, decode=True):
                if "error" in chunk:
                    raise DockerError(
                        f"push of {ref} failed: {chunk['error']}",
                        hint="is the registry in the image definition running and reachable?",
                    )
                if "aux" in chunk and "Digest" in chunk["aux"]:
                    digest = chunk["aux"]["Digest"]
                # Byte-count updates ("Pushing [==>  ]") would flood a log; their start and end lines say enough.
                if progress and "status" in chunk and not chunk.get("progressDetail"):
                    progress(f"{chunk.get('id', '')} {chunk['status']}".strip())
        except dockersdk.errors.APIError as exc:
            raise DockerError(f"push of {ref} failed: {exc.explanation or exc}") from exc
        return digest


def buildkit_invocation(
    *,
    context: Path,
    dockerfile: Path,
    tags: Sequence[str],
    buildargs: Mapping[str, str],
    labels: Mapping[str, str],
    target: str | None = None,
    cli: tuple[list[str], dict[str, str]] | None = None,
) -> BuildKitInvocation:
    """The docker CLI command that runs this build with BuildKit on the daemon (`cli`: from buildkit_cli())."""
    base, env = cli if cli is not None else buildkit_cli()
    argv = [*base, "--progress=plain", "--network=host", "-f", str(dockerfile)]
    if target:
        argv += ["--target", target]
    for key, value in buildargs.items():
        argv += ["--build-arg", f"{key}={value}"]
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    for t in tags:
        argv += ["-t", t]
    argv.append(str(context))
    return BuildKitInvocation(tuple(argv), env)


def _tar_of(files: Mapping[str, bytes]) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for path, content in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(content), 0o644
            tar.addfile(info, io.BytesIO(content))
    return data.getvalue()


def _single_entry(archive: bytes) -> FileEntry | None:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.next()
        if member is None:
            return None
        if member.issym():
            return FileEntry(SYMLINK, os.fsencode(member.linkname))
        if not member.isfile():
            return None
        handle = tar.extractfile(member)
        return FileEntry("100755" if member.mode & 0o111 else "100644", handle.read() if handle else b"")


def _docker_clis() -> Iterator[str]:
    """Every `docker` executable on PATH, in PATH order."""
    seen: set[str] = set()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(directory or ".") / "docker"
        real = str(candidate.resolve()) if candidate.exists() else ""
        if real and real not in seen and os.access(candidate, os.X_OK):
            seen.add(real)
            yield str(candidate)


def buildkit_cli() -> tuple[list[str], dict[str, str]]:
    """argv prefix and environment for a BuildKit build: `docker buildx build` where the buildx plugin
    exists, else a docker CLI older than 23 with DOCKER_BUILDKIT=1 (Debian's docker.io), which drives the
    daemon's own BuildKit."""
    legacy: str | None = None
    for cli in _docker_clis():
        if process.run([cli, "buildx", "version"], check=False).returncode == 0:
            return [cli, "buildx", "build", "--load"], {}
        version = process.run([cli, "version", "--format", "{{.Client.Version}}"], check=False).out.strip()
        major = version.split(".", 1)[0]
        if legacy is None and major.isdigit() and int(major) < 23:
            legacy = cli
    if legacy is not None:
        return [legacy, "build"], {"DOCKER_BUILDKIT": "1"}
    raise DockerError(
        "no docker CLI on PATH can run a BuildKit build",
        hint="install the buildx plugin, or Debian's docker.io (its CLI supports DOCKER_BUILDKIT=1)",
    )
