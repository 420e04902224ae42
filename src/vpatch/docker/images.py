"""The image part of the docker door: inspect, tag, remove, import, read files of, build and push images
(the SDK; the docker CLI for BuildKit builds)."""

from __future__ import annotations

import io
import os
import shlex
import tarfile
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING

from vpatch.base import ProcessError, Progress, run_process, stream_process
from vpatch.docker.daemon import TAIL_LINES, Daemon, DockerError, output_tail

if TYPE_CHECKING:
    import docker as dockersdk

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
class Layer:
    created_by: str
    size: int


@dataclass(frozen=True)
class BuildKitInvocation:
    """A BuildKit build as the docker CLI runs it: argv plus the environment it needs."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)

    def shell_line(self) -> str:

        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (prefix + " " if prefix else "") + shlex.join(self.argv)


def split_ref(ref: str) -> tuple[str, str]:
    """registry:5000/repo/name:tag -> (registry:5000/repo/name, tag); no tag means latest."""
    if ":" in ref.rsplit("/", 1)[-1]:
        repository, _, tag = ref.rpartition(":")
        return repository, tag
    return ref, "latest"


def inspect_image(client: dockersdk.DockerClient, ref: str, *, missing_hint: str | None = None) -> ImageInfo:
    """The image `ref` names on the daemon; DockerError (with `missing_hint`) when there is none.
    (A function of the client, not only a method, because the container part checks its image with it.)"""
    import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

    if not ref.strip():
        # The SDK would raise NullResource (not an APIError) for "": no image is named at all.
        raise DockerError(f"no image named ({ref!r} is empty)", hint="name an image by tag or id (`docker images`)")
    try:
        attrs = client.api.inspect_image(ref)
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


class Images(Daemon):
    """What vpatch does with images on the daemon."""

    def image(self, ref: str, *, missing_hint: str | None = None) -> ImageInfo:
        """The image `ref` names on the daemon; DockerError (with `missing_hint`) when there is none."""
        return inspect_image(self.client, ref, missing_hint=missing_hint)

    def has_image(self, ref: str) -> bool:
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

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
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

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

    # Files

    def read_files(self, image: str, paths: Sequence[str]) -> dict[str, bytes | None]:
        """Contents of absolute `paths` inside `image` (None: absent, or not a regular file)."""
        return {path: e.data if e is not None and e.mode != SYMLINK else None
                for path, e in self.read_entries(image, paths).items()}

    def read_entries(self, image: str, paths: Sequence[str]) -> dict[str, FileEntry | None]:
        """Each of the absolute `paths` inside `image` as git would record it (None: absent, or neither a
        regular file nor a symlink), read without starting a container."""
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

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
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

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
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

        recent: deque[str] = deque(maxlen=TAIL_LINES)
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
                        f"output of the failing step:\n{output_tail(recent)}"
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
            result = stream_process(invocation.argv, on_line, env=invocation.env, check=False)
        except ProcessError as exc:
            raise DockerError("the docker CLI cannot run: " + exc.message, hint="install docker.io") from exc
        if result.returncode != 0:
            raise DockerError(
                f"BuildKit build failed with exit code {result.returncode}: {invocation.shell_line()}\n"
                f"output of the failing step:\n{output_tail(result.out.splitlines())}"
            )

    # Registries

    def push(self, ref: str, progress: Progress | None = None) -> str | None:
        """Push `ref` to its registry; returns the pushed manifest digest."""
        import docker as dockersdk  # lazy: the docker SDK loads only when a daemon is used, never for --help or status

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
        if run_process([cli, "buildx", "version"], check=False).returncode == 0:
            return [cli, "buildx", "build", "--load"], {}
        version = run_process([cli, "version", "--format", "{{.Client.Version}}"], check=False).out.strip()
        major = version.split(".", 1)[0]
        if legacy is None and major.isdigit() and int(major) < 23:
            legacy = cli
    if legacy is not None:
        return [legacy, "build"], {"DOCKER_BUILDKIT": "1"}
    raise DockerError(
        "no docker CLI on PATH can run a BuildKit build",
        hint="install the buildx plugin, or Debian's docker.io (its CLI supports DOCKER_BUILDKIT=1)",
    )
