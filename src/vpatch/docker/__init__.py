"""The one door to docker: the docker SDK for everything it can do, the docker CLI for BuildKit builds and
where a command line is the product. `daemon` connects and names the errors; `images` and `containers` are its
two parts, joined in one `Docker` handle."""

from __future__ import annotations

from vpatch.docker.containers import ContainerInfo, Containers
from vpatch.docker.daemon import DaemonGone, DockerError
from vpatch.docker.images import (
    SYMLINK,
    BuildKitInvocation,
    FileEntry,
    ImageInfo,
    Images,
    Layer,
    buildkit_cli,
    buildkit_invocation,
    split_ref,
)

__all__ = [
    "SYMLINK",
    "BuildKitInvocation",
    "ContainerInfo",
    "DaemonGone",
    "Docker",
    "DockerError",
    "FileEntry",
    "ImageInfo",
    "Layer",
    "buildkit_cli",
    "buildkit_invocation",
    "split_ref",
]


class Docker(Images, Containers):
    """A connection to one docker daemon, with methods named by what vpatch needs from it: its images and
    its containers."""
