"""The `serve:` section of images/<name>.yaml: vLLM's arguments, the environment and the container options.

It is the only place the server's configuration lives; `render` turns it into the one `docker run` that
starts it. Parsed by `ServeConfig.parse(doc, data, "serve")` from ImageDefinition.parse, so errors name
the file and the key path like every other section.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vpatch.config import _Doc

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTAINER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")
_SIZE = re.compile(r"^\d+[bkmgBKMG]?$")
_RESTART = re.compile(r"^(no|always|unless-stopped|on-failure(:\d+)?)$")
_GPUS = re.compile(r"^(all|\d+|device=\d+(,\d+)*)$")

DEFAULT_PORT = 8000
DEFAULT_RESTART = "unless-stopped"
DEFAULT_HEALTH_TIMEOUT = 1200  # seconds; the GPU host needs ~15 minutes to load the weights


@dataclass(frozen=True)
class VllmFlag:
    """One typed key of `serve:` and the `vllm serve` flag it becomes."""

    key: str  # yaml key and ServeConfig field, e.g. max_model_len
    kind: type  # int, float, str or bool
    flag: str  # e.g. --max-model-len


def _flag(key: str, kind: type) -> VllmFlag:
    return VllmFlag(key, kind, "--" + key.replace("_", "-"))


# The typed vLLM arguments, in the order they are rendered. `port` is always rendered; a bool renders
# as --flag when true and --no-flag when false (vLLM's boolean engine arguments take both forms; the lint
# checks that the image's vLLM knows the form used). Anything else goes into `extra_args` verbatim.
VLLM_FLAGS: tuple[VllmFlag, ...] = (
    _flag("served_model_name", str),
    _flag("host", str),
    _flag("port", int),
    _flag("tensor_parallel_size", int),
    _flag("pipeline_parallel_size", int),
    _flag("enable_expert_parallel", bool),
    _flag("max_model_len", int),
    _flag("max_num_seqs", int),
    _flag("max_num_batched_tokens", int),
    _flag("kv_cache_dtype", str),
    _flag("kv_cache_memory_bytes", int),
    _flag("gpu_memory_utilization", float),
    _flag("block_size", int),
    _flag("mamba_cache_mode", str),
    _flag("enable_prefix_caching", bool),
    _flag("enable_chunked_prefill", bool),
    _flag("enable_auto_tool_choice", bool),
    _flag("tool_call_parser", str),
    _flag("reasoning_parser", str),
    _flag("enforce_eager", bool),
)
_BY_KEY = {f.key: f for f in VLLM_FLAGS}


@dataclass(frozen=True)
class ContainerOptions:
    """How the container runs: `docker run` options, not vLLM's."""

    name: str
    restart: str = DEFAULT_RESTART  # no | always | unless-stopped | on-failure[:N]
    gpus: str | None = None  # all | N | device=0,1,2,3
    ipc: str | None = None  # e.g. host (vLLM's tensor parallel workers share memory through /dev/shm)
    shm_size: str | None = None  # e.g. 16g, when ipc is not host
    network: str | None = None  # e.g. host; otherwise the port is published as PORT:PORT
    volumes: tuple[str, ...] = ()  # docker -v values, e.g. /srv/models:/models:ro


@dataclass(frozen=True)
class ServeConfig:
    """Everything `vpatch serve` needs to start the server; the typed fields mirror VLLM_FLAGS."""

    model: str  # vllm serve's positional model: a path inside the container or a model id
    container: ContainerOptions
    command: tuple[str, ...] = ()  # words before the model; empty when the entrypoint already is `vllm serve`
    extra_args: tuple[str, ...] = ()  # further vLLM flags, appended verbatim (and linted like the rest)
    env: tuple[tuple[str, str], ...] = ()  # the container's environment, in the yaml's order
    health_timeout: int = DEFAULT_HEALTH_TIMEOUT  # seconds to wait for /health after the start
    port: int = DEFAULT_PORT
    served_model_name: str | None = None
    host: str | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    enable_expert_parallel: bool | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    block_size: int | None = None
    mamba_cache_mode: str | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    enable_auto_tool_choice: bool | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    enforce_eager: bool | None = None

    @property
    def environment(self) -> dict[str, str]:
        return dict(self.env)

    def vllm_args(self) -> tuple[str, ...]:
        """What follows the image's entrypoint: `command`, the model, the typed flags, then `extra_args`."""
        out: list[str] = [*self.command, self.model]
        for spec in VLLM_FLAGS:
            value = getattr(self, spec.key)
            if value is None:
                continue
            if spec.kind is bool:
                out.append(spec.flag if value else "--no-" + spec.flag[2:])
            else:
                out += [spec.flag, str(value)]
        out += self.extra_args
        return tuple(out)

    @classmethod
    def parse(cls, doc: _Doc, value: Any, key: str, *, default_name: str) -> ServeConfig:
        """Validate the `serve:` mapping at `key`; `default_name` names the container when the yaml does not."""
        other = {"model", "command", "extra_args", "env", "container", "health_timeout"}
        data = doc.mapping(value, key, required={"model"}, optional=other | set(_BY_KEY))
        typed: dict[str, Any] = {}
        for spec in VLLM_FLAGS:
            if data.get(spec.key) is not None:
                typed[spec.key] = _typed(doc, data[spec.key], f"{key}.{spec.key}", spec.kind)
        if "port" in typed and not 0 < typed["port"] < 65536:
            doc.fail(f"{key}.port", f"must be a TCP port (1-65535), not {typed['port']}")
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "max_model_len", "max_num_seqs",
                     "max_num_batched_tokens", "kv_cache_memory_bytes", "block_size"):
            if name in typed and typed[name] < 1:
                doc.fail(f"{key}.{name}", f"must be a positive whole number, not {typed[name]}")
        if "gpu_memory_utilization" in typed and not 0 < typed["gpu_memory_utilization"] <= 1:
            doc.fail(f"{key}.gpu_memory_utilization", "must be a fraction in (0, 1]")
        if typed.get("tool_call_parser") and typed.get("enable_auto_tool_choice") is None:
            # vLLM ignores a tool parser unless auto tool choice is on; say so instead of serving without tools.
            doc.fail(f"{key}.enable_auto_tool_choice", "must be set (true) when tool_call_parser is set")
        health_timeout = _typed(doc, data.get("health_timeout", DEFAULT_HEALTH_TIMEOUT), f"{key}.health_timeout", int)
        if health_timeout < 1:
            doc.fail(f"{key}.health_timeout", "must be a positive number of seconds")
        return cls(
            model=doc.string(data, f"{key}.model"),
            command=_strings(doc, data.get("command"), f"{key}.command"),
            extra_args=_strings(doc, data.get("extra_args"), f"{key}.extra_args"),
            env=_env(doc, data.get("env"), f"{key}.env"),
            container=_container(doc, data.get("container"), f"{key}.container", default_name),
            health_timeout=health_timeout,
            **typed,
        )


def _typed(doc: _Doc, value: Any, key: str, kind: type) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            doc.fail(key, f"must be true or false, not {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            doc.fail(key, f"must be a whole number, not {value!r}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            doc.fail(key, f"must be a number, not {value!r}")
        return float(value)
    if not isinstance(value, str) or not value.strip():
        doc.fail(key, f"must be a non-empty string, not {value!r}")
    return value


def _strings(doc: _Doc, value: Any, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        doc.fail(key, f"must be a list of strings, not {type(value).__name__}")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            doc.fail(f"{key}[{i}]", f"must be a string, not {item!r}")
        out.append(str(item))
    return tuple(out)


def _env(doc: _Doc, value: Any, key: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        doc.fail(key, f"must be a mapping of NAME: value, not {type(value).__name__}")
    out = []
    for name, item in value.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            doc.fail(f"{key}.{name}", "is not a valid environment variable name")
        if item is None or isinstance(item, (dict, list)):
            doc.fail(f"{key}.{name}", f"must be a string or number, not {item!r}")
        text = ("1" if item else "0") if isinstance(item, bool) else str(item)
        out.append((name, text))
    return tuple(out)


def _container(doc: _Doc, value: Any, key: str, default_name: str) -> ContainerOptions:
    data = doc.mapping(value or {}, key, optional={"name", "restart", "gpus", "ipc", "shm_size", "network", "volumes"})
    name = doc.string(data, f"{key}.name", default_name)
    if not _CONTAINER_NAME.match(name):
        doc.fail(f"{key}.name", f"is not a valid container name: {name!r}")
    restart = doc.string(data, f"{key}.restart", DEFAULT_RESTART)
    if not _RESTART.match(restart):
        doc.fail(f"{key}.restart", f"must be no, always, unless-stopped or on-failure[:N], not {restart!r}")
    gpus = data.get("gpus")
    if gpus is not None:
        gpus = str(gpus) if isinstance(gpus, int) and not isinstance(gpus, bool) else gpus
        if not isinstance(gpus, str) or not _GPUS.match(gpus):
            doc.fail(f"{key}.gpus", f"must be all, a count or device=0,1,..., not {gpus!r}")
    shm_size = data.get("shm_size")
    if shm_size is not None and not (isinstance(shm_size, str) and _SIZE.match(shm_size)):
        doc.fail(f"{key}.shm_size", f"must be a size like 16g or 512m, not {shm_size!r}")
    volumes = _strings(doc, data.get("volumes"), f"{key}.volumes")
    for i, volume in enumerate(volumes):
        if volume.count(":") not in (1, 2) or not all(volume.split(":")[:2]):
            doc.fail(f"{key}.volumes[{i}]", f"must be SOURCE:TARGET[:OPTIONS], not {volume!r}")
    return ContainerOptions(
        name=name,
        restart=restart,
        gpus=gpus,
        ipc=doc.optional_string(data, f"{key}.ipc"),
        shm_size=shm_size,
        network=doc.optional_string(data, f"{key}.network"),
        volumes=volumes,
    )
