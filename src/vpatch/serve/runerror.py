"""A `docker run` that failed: the yaml key its error names, and no half-created container left behind
(`docker run --detach` creates the container before the daemon refuses to start it; left there, the
`Created` container holds the name and blocks the next serve)."""

from __future__ import annotations

import re

from vpatch.base import VpatchError
from vpatch.docker import Docker, DockerError
from vpatch.serve.render import LABEL_DEFINITION, RunCommand

# What the daemon says -> the serve: key that made the `docker run` option, and that option.
_CAUSES: tuple[tuple[re.Pattern[str], str, str], ...] = tuple((re.compile(p, re.I), k, o) for p, k, o in (
    (r"invalid ipc mode", "serve.container.ipc", "--ipc"),
    (r"network \S+ not found|invalid network mode|network mode", "serve.container.network", "--network"),
    (r"could not select device driver|\[\[gpu\]\]|nvidia", "serve.container.gpus", "--gpus"),
    (r"invalid mode: |invalid volume specification|invalid mount config|bind source path|volume name",
     "serve.container.volumes", "--volume"),
    (r"shm.?size", "serve.container.shm_size", "--shm-size"),
    (r"restart polic", "serve.container.restart", "--restart"),
    (r"port is already allocated|address already in use|invalid port", "serve.port", "--publish"),
    (r"container name .* is already in use", "serve.container.name", "--name"),
    (r"executable file not found|exec format error", "serve.command", ""),
))


def cause(message: str, command: RunCommand) -> tuple[str, str] | None:
    """The serve: key a docker error names, with the value `command` gave it; None when it names none."""
    for pattern, key, option in _CAUSES:
        if pattern.search(message):
            values = [command.argv[i + 1] for i, word in enumerate(command.argv[:-1]) if option and word == option]
            return key, ", ".join(values)
    return None


def definition_of(command: RunCommand) -> str:
    label = next((w for w in command.argv if w.startswith(f"{LABEL_DEFINITION}=")), "")
    return label.partition("=")[2] or "?"


def explain(docker: Docker, command: RunCommand, error: DockerError) -> VpatchError:
    """The error to raise for a failed `docker run`, after removing the container it created but could not start."""
    # The name was free before (serve refuses a taken one, deploy parked production first): a never-started
    # container under it now is the one this run created, unless docker says the name was already taken.
    taken = re.search(r"is already in use", error.message) is not None
    left = None if taken else docker.container(command.name)
    removed = ""
    if left is not None and left.status == "created" and left.labels.get(LABEL_DEFINITION) == definition_of(command):
        docker.remove_container(left.id)
        removed = f"; the container it created ({left.id[:12]}, never started) was removed"
    lines = [ln.strip() for ln in error.message.splitlines() if ln.strip()]
    said = next((ln for ln in lines if "Error response from daemon" in ln or ln.startswith("docker:")), lines[-1] if lines else "")
    source = f"images/{definition_of(command)}.yaml"
    found = cause(said, command)
    if found is None:
        return VpatchError(f"docker could not start {command.name}: {said}{removed}",
                           hint=error.hint or f"`vpatch serve {definition_of(command)} --print` shows the command")
    key, value = found
    shown = f" ({value})" if value else ""
    return VpatchError(f"docker could not start {command.name}: {said}: check {key}{shown} in {source}{removed}",
                       hint=f"fix {key} in {source}")
