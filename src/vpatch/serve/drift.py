"""Drift: the running container (docker inspect) against the yaml's serve: section and the image it names."""

from __future__ import annotations

from dataclasses import dataclass

from vpatch.base import VpatchError
from vpatch.config import ImageDefinition, Pin
from vpatch.docker import ContainerInfo, Docker, DockerError, ImageInfo
from vpatch.image import LABEL_PREFIX
from vpatch.serve import render
from vpatch.serve.lint import serves

# Image labels worth showing when the image differs (vpatch build's and the OCI ones).
_LABELS = ("org.opencontainers.image.version", "io.vpatch.pin.ref", "io.vpatch.content", "io.vpatch.patches")


@dataclass(frozen=True)
class Drift:
    what: str  # e.g. "--max-model-len", "env VLLM_X", "image", "restart policy"
    yaml: str  # what the yaml (and the image it names) says; "(absent)" when it says nothing
    running: str  # what the container runs with; "(absent)" when it has none


@dataclass(frozen=True)
class DriftReport:
    container: ContainerInfo
    image: str  # the reference the yaml (or --image) names
    running_image: str  # the image the container runs, with its version/pin/content labels
    drifts: tuple[Drift, ...]


ABSENT = "(absent)"
RUNNING = "running"


def _state(info: ContainerInfo) -> str:
    """`running` for a container that serves; otherwise what it is doing instead, in words."""
    if info.status == "running" and info.health != "unhealthy":
        return RUNNING
    if info.status == "running":
        return "running, but its health check says unhealthy"
    if info.status == "restarting":
        return f"restarting (restart {info.restart_count}, last exit code {info.exit_code})"
    if info.status in ("exited", "dead"):
        return f"{info.status} (exit code {info.exit_code})"
    return info.status  # created (never started) or paused


def diff(docker: Docker, definition: ImageDefinition, *, image: str | None = None, pin: Pin | None = None) -> DriftReport:
    """Compare the container the yaml names with what the yaml would start now; with the project's `pin`,
    also the pin the running image's vpatch labels say it was built from."""
    command = render.for_definition(definition, image=image)
    serve = definition.serve
    assert serve is not None
    running = docker.container(command.name)
    if running is None:
        raise VpatchError(f"no container named {command.name} on this docker daemon",
                          hint=f"vpatch serve {definition.name} starts it")
    drifts: list[Drift] = []
    state = _state(running)
    if state != RUNNING:
        # The yaml describes a server that serves: a stopped, restarting or unhealthy one runs nothing of it.
        drifts.append(Drift("state", RUNNING, state))
    try:
        wanted: ImageInfo | None = docker.image(command.image)
    except DockerError:
        wanted = None
    have = docker.image(running.image_id) if docker.has_image(running.image_id) else None
    if wanted is None or wanted.id != running.image_id:
        drifts.append(Drift("image", _describe(command.image, wanted), _describe(running.image_ref, have)))
    built_from = have.labels.get(f"{LABEL_PREFIX}.pin.commit") if have else None
    if pin is not None and pin.commit and built_from and built_from != pin.commit:
        label_ref = have.labels.get(f"{LABEL_PREFIX}.pin.ref", "?") if have else "?"
        drifts.append(Drift("image pin", f"{pin.ref} ({pin.commit[:12]}, vpatch.yaml)", f"{label_ref} ({built_from[:12]})"))
    drifts += _args(command.args, running)
    image_env = _env_map(docker.image(running.image_id).env if docker.has_image(running.image_id) else ())
    drifts += _env(serve.environment, _env_map(running.env), image_env)
    options = serve.container
    drifts += _field("restart policy", options.restart, running.restart_policy)
    if options.ipc is not None:
        drifts += _field("ipc", options.ipc, running.ipc_mode)
    if options.shm_size is not None:
        drifts += _field("shm size", str(_bytes(options.shm_size)), str(running.shm_size))
    # The container's memory limit: the deploy's memory check measures free memory against it, so a container
    # started by hand without --memory (or with another) is not the server the yaml describes.
    drifts += _field("memory limit", _limit(_bytes(options.memory) if options.memory else 0),
                     _limit(running.memory_limit))
    drifts += _field("network", _network(options.network or ""), _network(running.network_mode))
    if options.network != "host":
        published = ", ".join(f"{p}->{'/'.join(h)}" for p, h in sorted(running.port_bindings.items())) or ABSENT
        drifts += _field("published port", f"{serve.port}/tcp->{serve.port}", published)
    drifts += _field("gpus", options.gpus or ABSENT, ", ".join(running.gpus) or ABSENT)
    drifts += _field("volumes", " ".join(sorted(options.volumes)) or ABSENT, " ".join(sorted(running.binds)) or ABSENT)
    drifts += _health(render.health_check(serve), running)
    return DriftReport(running, command.image, _describe(running.image_ref, have), tuple(drifts))


def _describe(ref: str, info: ImageInfo | None) -> str:
    if info is None:
        return f"{ref} (not on this daemon)"
    labels = ", ".join(f"{k.rsplit('.', 1)[-1]}={info.labels[k]}" for k in _LABELS if k in info.labels)
    return f"{ref} ({info.id.removeprefix('sha256:')[:12]}" + (f"; {labels})" if labels else ")")


def _args(wanted: tuple[str, ...], running: ContainerInfo) -> list[Drift]:
    """Positional words compared in order, flags by name (their order does not matter to vLLM)."""
    want_pos, want_flags = _split(wanted)
    have_pos, have_flags = _split(running.args)
    out = []
    if want_pos != have_pos:
        out.append(Drift("arguments", " ".join(want_pos), " ".join(have_pos)))
    for flag in sorted(set(want_flags) | set(have_flags), key=lambda f: (f not in want_flags, f)):
        a, b = want_flags.get(flag, ABSENT), have_flags.get(flag, ABSENT)
        if a != b:
            out.append(Drift(flag, a or "(set)", b or "(set)"))
    if running.entrypoint and serves(running.entrypoint) is None and serves(running.args) is None:
        out.append(Drift("entrypoint", "vllm serve", " ".join(running.entrypoint)))
    return out


def _split(args: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    positional: list[str] = []
    flags: dict[str, str] = {}
    i = 0
    while i < len(args):
        word = args[i]
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            name = "--" + name[2:].replace("_", "-")
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
                value, i = args[i + 1], i + 1
            flags[name] = value
        else:
            positional.append(word)
        i += 1
    return positional, flags


def _env(wanted: dict[str, str], running: dict[str, str], image: dict[str, str]) -> list[Drift]:
    out = []
    for key in sorted(set(wanted) | set(running)):
        if key not in wanted and image.get(key) == running.get(key):
            continue  # the image's own default, not set by the run
        a = wanted.get(key, image.get(key, ABSENT))
        b = running.get(key, ABSENT)
        if a != b:
            out.append(Drift(f"env {key}", a, b))
    return out


def _env_map(lines: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for line in lines:
        key, _, value = line.partition("=")
        out[key] = value
    return out


def _health(wanted: render.HealthCheck, running: ContainerInfo) -> list[Drift]:
    """The container's health check against the one `vpatch serve` gives now: the liveness rule it runs (an
    older vpatch's, another command, none) and docker's timings."""
    test = running.health_test
    command = test[1] if len(test) == 2 and test[0] == "CMD-SHELL" else None
    drifts: list[Drift] = []
    if command != wanted.command:
        ours = "vpatch's liveness check (serve/alive.py of this vpatch)"
        if not test or test[0] == "NONE":
            seen = ABSENT
        elif command is not None and render.health_source(command) is not None:
            seen = "vpatch's liveness check, " + (
                "another vpatch's serve/alive.py" if render.health_source(command) != render.health_source(wanted.command)
                else "with other arguments (port, host or timeouts)")
        else:
            seen = f"another command: {' '.join(test)[:120]}"
        drifts.append(Drift("health check", ours, seen))
    names = ("health interval (s)", "health timeout (s)", "health retries", "health start period (s)")
    wanted_timing = (wanted.interval_s, wanted.timeout_s, wanted.retries, wanted.start_period_s)
    if test and test[0] != "NONE":
        for what, want, have in zip(names, wanted_timing, running.health_timing, strict=True):
            drifts += _field(what, str(want), str(have))
    return drifts


def _network(mode: str) -> str:
    return "default" if mode in ("", "default", "bridge") else mode


def _field(what: str, wanted: str, running: str) -> list[Drift]:
    return [] if wanted == running else [Drift(what, wanted, running)]


def _limit(size: int) -> str:
    return f"{size:,} bytes ({size / 1024**2:,.0f} MiB)" if size else ABSENT


def _bytes(size: str) -> int:
    units = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
    unit = size[-1].lower()
    return int(size[:-1]) * units[unit] if unit in units else int(size)
