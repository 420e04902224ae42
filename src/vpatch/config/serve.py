"""The `serve:` section of images/<name>.yaml: vLLM's arguments, the environment and the container options.

It is the only place the server's configuration lives; `render` turns it into the one `docker run` that
starts it. Parsed on first use by ImageDefinition (definition.py) through the one document reader, so errors
name the file and the key path like every other section. A config-layer module: it imports nothing but
the config layer (document.py, errors.py), whatever else lives in serve/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vpatch.config.document import Document

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
    memory: str | None = None  # docker --memory, e.g. 24g: the container's limit (deploy's memory check reads it)


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
    def model_name(self) -> str:
        """The name /v1/models lists: served_model_name (typed or in extra_args, its first name), else the model."""
        if self.served_model_name:
            return self.served_model_name.split()[0]
        use = self.flag("--served-model-name")
        return use.value.split()[0] if use is not None and use.value else self.model

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


    def flag(self, name: str) -> FlagUse | None:
        """How the rendered arguments give vLLM's flag `name` (in any spelling); None when they do not.
        Parsing made sure each flag is given once, by a typed key or by extra_args."""
        family = flag_family(name)
        return next((use for use in flag_uses(self, "serve") if use.flag == family), None)

    @classmethod
    def parse(cls, doc: Document, value: Any, key: str, *, default_name: str) -> ServeConfig:
        """Validate the `serve:` mapping at `key`; `default_name` names the container when the yaml does not."""
        other = {"model", "command", "extra_args", "env", "container", "health_timeout"}
        data = doc.filled(value, key, required={"model"}, optional=other | set(_BY_KEY))
        typed: dict[str, Any] = {}
        for spec in VLLM_FLAGS:
            if spec.key in data:
                typed[spec.key] = _typed(doc, data, f"{key}.{spec.key}", spec.kind)
        if "port" in typed and not 0 < typed["port"] < 65536:
            doc.fail(f"{key}.port", f"must be a TCP port (1-65535), not {typed['port']}")
        if "gpu_memory_utilization" in typed and not 0 < typed["gpu_memory_utilization"] <= 1:
            doc.fail(f"{key}.gpu_memory_utilization", "must be a fraction in (0, 1]")
        config = cls(
            model=doc.string(data, f"{key}.model"),
            command=doc.texts(data["command"], f"{key}.command") if "command" in data else (),
            extra_args=doc.texts(data["extra_args"], f"{key}.extra_args") if "extra_args" in data else (),
            env=_env(doc, data, f"{key}.env"),
            container=_container(doc, data, f"{key}.container", default_name),
            health_timeout=doc.count(data, f"{key}.health_timeout", DEFAULT_HEALTH_TIMEOUT),
            **typed,
        )
        if config.health_timeout > _MAX_HEALTH_TIMEOUT:
            # docker's --health-start-period takes it too, and refuses 10^12 s with only "see docker run --help".
            doc.fail(f"{key}.health_timeout", f"is {config.health_timeout:,} s, over a week ({_MAX_HEALTH_TIMEOUT:,} s): "
                     "no server loads that long", hint=f"give {key}.health_timeout in seconds (the GPU host loads in ~900)")
        if config.model != config.model.strip():
            doc.fail(f"{key}.model", f"has white space at its start or end ({config.model!r}): vLLM would look for "
                     "a model of that name", hint=f"write {key}.model without the spaces")
        _check_parallel(doc, config, key)
        _check_serve_words(doc, config, key)
        _check_flags(doc, config, key)
        if config.container.network == "none":
            # docker takes --network none with --publish, and the health wait then polls a port nothing reaches.
            doc.fail(f"{key}.container.network", f"is none: the container has no network, so nothing reaches "
                     f"{key}.port ({config.port}) and the health wait could never end",
                     hint="use host, the default bridge (leave the key out) or a docker network of yours")
        return config


@dataclass(frozen=True)
class FlagUse:
    """One vLLM flag as the rendered arguments give it."""

    flag: str  # its one name: --max_model_len=4096 and --no-enforce-eager give --max-model-len, --enforce-eager
    value: str | None  # the value given; None for a flag given alone (a boolean)
    negated: bool  # given in its --no- form (or a typed boolean that is false)
    where: str  # the yaml key that gives it, e.g. serve.max_model_len or serve.extra_args[2]


def flag_family(word: str) -> str:
    """The one name of a long flag in any spelling: `--max_model_len=4096` -> `--max-model-len`, and a
    boolean's `--no-` form -> the flag itself (vLLM reads `_` as `-`; both forms set one value)."""
    name = word.split("=", 1)[0]
    if not name.startswith("--"):
        return name
    name = "--" + name[2:].replace("_", "-")
    return "--" + name[5:] if name.startswith("--no-") else name


_BOOLEAN_FLAGS = frozenset(f.flag for f in VLLM_FLAGS if f.kind is bool)
_NEGATIVE_NUMBER = re.compile(r"^-\d")


def flag_uses(config: ServeConfig, key: str) -> list[FlagUse]:
    """Every flag the rendered arguments give, typed keys first (as rendered), then command and extra_args words."""
    uses = []
    for spec in VLLM_FLAGS:
        value = getattr(config, spec.key)
        if value is None:
            continue
        if spec.kind is bool:
            uses.append(FlagUse(spec.flag, None, not value, f"{key}.{spec.key}"))
        else:
            uses.append(FlagUse(spec.flag, str(value), False, f"{key}.{spec.key}"))
    for part, words in (("command", config.command), ("extra_args", config.extra_args)):
        uses += [use for use, _ in _word_flags(words, f"{key}.{part}")]
    return uses


def _word_flags(words: tuple[str, ...], key: str) -> list[tuple[FlagUse, int | None]]:
    """The flags among `words` (with the index of the word taken as a flag's value, if any)."""
    out: list[tuple[FlagUse, int | None]] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("-") and not _NEGATIVE_NUMBER.match(word):
            family = flag_family(word)
            name, eq, value = word.partition("=")
            taken: int | None = None
            nxt = words[i + 1] if i + 1 < len(words) else None
            if not eq and nxt is not None and family not in _BOOLEAN_FLAGS and (
                    not nxt.startswith("-") or _NEGATIVE_NUMBER.match(nxt)):
                value, taken = nxt, i + 1
            negated = name.replace("_", "-").startswith("--no-")
            out.append((FlagUse(family, value if (eq or taken is not None) else None, negated, f"{key}[{i}]"), taken))
            i = taken if taken is not None else i
        i += 1
    return out


def _check_flags(doc: Document, config: ServeConfig, key: str) -> None:
    """One value per vLLM flag; a tool parser only with auto tool choice on (vLLM ignores it otherwise)."""
    seen: dict[str, FlagUse] = {}
    for use in flag_uses(config, key):
        first = seen.setdefault(use.flag, use)
        if first is use:
            continue
        if use.flag == "--port":
            doc.fail(use.where, f"gives --port again: {key}.port ({config.port}) is the port vLLM listens on, the "
                     "port published and the one the health wait polls", hint=f"remove it and set {key}.port")
        doc.fail(use.where, f"gives {use.flag} a second time ({first.where} gives it already): vLLM would take the "
                 "last one silently and `serve --diff` could not tell",
                 hint=f"give {use.flag} once, in {first.where} or here")
    parser, auto = seen.get("--tool-call-parser"), seen.get("--enable-auto-tool-choice")
    if parser is not None and auto is None:
        # vLLM ignores a tool parser unless auto tool choice is on; say so instead of serving without tools.
        doc.fail(f"{key}.enable_auto_tool_choice", f"must be set (true) when a tool parser is set ({parser.where})")
    if parser is not None and auto is not None and auto.negated:
        doc.fail(auto.where, f"is false while a tool parser is set ({parser.where}): the server would take no "
                 "tool calls", hint=f"set {key}.enable_auto_tool_choice: true, or remove the tool parser")
    if auto is not None and not auto.negated and parser is None:
        doc.fail(auto.where, "is true without a tool parser: vLLM refuses to start",
                 hint=f"set {key}.tool_call_parser (e.g. hermes, qwen3_coder)")


_MAX_HEALTH_TIMEOUT = 7 * 24 * 3600


def _gpu_count(gpus: str | None) -> int | None:
    """How many GPUs `container.gpus` gives: a count, or a device list; None for all (or none given)."""
    if gpus is None or gpus == "all":
        return None
    if gpus.isdigit():
        return int(gpus)
    devices = gpus.removeprefix("device=").strip('"')
    return len([d for d in devices.split(",") if d])


def _check_parallel(doc: Document, config: ServeConfig, key: str) -> None:
    """tensor_parallel_size x pipeline_parallel_size workers need as many GPUs: fewer named is a start that fails."""
    have = _gpu_count(config.container.gpus)
    need = (config.tensor_parallel_size or 1) * (config.pipeline_parallel_size or 1)
    if have is not None and have > 0 and need > have:
        doc.fail(f"{key}.tensor_parallel_size", f"x pipeline_parallel_size is {need}, but {key}.container.gpus "
                 f"({config.container.gpus}) gives {have} GPU(s): vLLM needs one per worker",
                 hint=f"name {need} GPUs in {key}.container.gpus, or lower tensor_parallel_size")


def _norm(word: str) -> list[str]:
    return word.casefold().split()


def _check_serve_words(doc: Document, config: ServeConfig, key: str) -> None:
    """The `vllm serve serve` crash loop, in every spelling the yaml alone shows: `serve` in any case or with
    spaces in command, a model that begins with it, or a bare `serve` among extra_args (a second model)."""
    for i, word in enumerate(config.command):
        if "serve" in _norm(word) and word != "serve":
            doc.fail(f"{key}.command[{i}]", f"is {word!r}, not the word `serve`: vLLM's CLI takes its subcommand "
                     "exactly (lower case, one word of its own)",
                     hint="write serve, or leave it out when the image's entrypoint already is `vllm serve`")
    for part, words in (("command", config.command), ("extra_args", config.extra_args)):
        if "--" in words:
            # The lint said "has no flag --" and blamed serve.extra_args even where the `--` was in command.
            doc.fail(f"{key}.{part}[{words.index('--')}]", "is `--`: it ends vLLM's options, and every word "
                     "after it (the model, the flags) would be read as a positional argument",
                     hint=f"remove the `--` from {key}.{part}")
    if config.command.count("serve") > 1:
        doc.fail(f"{key}.command", f"says `serve` twice: {config.command!r}", hint="say serve once")
    if _norm(config.model)[:1] == ["serve"]:
        doc.fail(f"{key}.model", f"begins with `serve` ({config.model!r}): vLLM would read it as the model and "
                 "refuse to start (a crash loop under a restart policy)",
                 hint=f"{key}.model is the model alone; `serve` belongs to the entrypoint or {key}.command")
    values = {taken for _, taken in _word_flags(config.extra_args, f"{key}.extra_args") if taken is not None}
    for i, word in enumerate(config.extra_args):
        if i not in values and not word.startswith("-") and "serve" in _norm(word):
            doc.fail(f"{key}.extra_args[{i}]", f"is {word!r}: after the model vLLM reads it as a second positional "
                     "argument and refuses to start (a crash loop under a restart policy)",
                     hint=f"remove it: the entrypoint (or {key}.command) says serve")


def _typed(doc: Document, data: dict[str, Any], key: str, kind: type) -> Any:
    if kind is bool:
        return doc.flag(data, key)
    if kind is int:
        return doc.count(data, key)
    if kind is float:
        return doc.number(data, key)
    return doc.string(data, key)


def _env(doc: Document, data: dict[str, Any], key: str) -> tuple[tuple[str, str], ...]:
    if "env" not in data:
        return ()
    value = data["env"]
    if not isinstance(value, dict) or not value:
        doc.fail(key, f"must be a mapping of NAME: value (leave the key out for none), not {doc.shown(value)}")
    out = []
    for name in value:
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            doc.fail(f"{key}.{name}", "is not a valid environment variable name")
        if isinstance(value[name], (dict, list)):
            doc.fail(f"{key}.{name}", f"must be a string or number, not {doc.shown(value[name])}")
        # As written: `0123`, `2.10`, `1:30` and `on` stay those strings (YAML 1.1 would give 83, 2.1, 90, 1).
        out.append((name, doc.text(value, name, f"{key}.{name}")))
    return tuple(out)


def _container(doc: Document, parent: dict[str, Any], key: str, default_name: str) -> ContainerOptions:
    data = doc.section(parent, key, optional={"name", "restart", "gpus", "ipc", "shm_size", "network", "volumes",
                                                        "memory"}) or {}
    name = doc.string(data, f"{key}.name", default_name)
    if not _CONTAINER_NAME.match(name):
        doc.fail(f"{key}.name", f"is not a valid container name: {name!r}")
    restart = doc.string(data, f"{key}.restart", DEFAULT_RESTART)
    if not _RESTART.match(restart):
        doc.fail(f"{key}.restart", f"must be no, always, unless-stopped or on-failure[:N], not {restart!r}")
    gpus = doc.text(data, "gpus", f"{key}.gpus") if "gpus" in data else None
    if gpus is not None and not _GPUS.match(gpus):
        doc.fail(f"{key}.gpus", f"must be all, a count or device=0,1,..., not {gpus!r}")
    shm_size = doc.optional_string(data, f"{key}.shm_size")
    if shm_size is not None and not _SIZE.match(shm_size):
        doc.fail(f"{key}.shm_size", f"must be a size like 16g or 512m, not {shm_size!r}")
    memory = doc.optional_string(data, f"{key}.memory")
    if memory is not None and not _SIZE.match(memory):
        doc.fail(f"{key}.memory", f"must be a size like 24g or 512m, not {memory!r}")
    volumes = doc.texts(data["volumes"], f"{key}.volumes") if "volumes" in data else ()
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
        memory=memory,
    )
