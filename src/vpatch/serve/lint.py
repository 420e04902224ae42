"""Lint a `docker run` against the image before anything is touched: its entrypoint, and every flag
against the vLLM inside it (the option strings of that version's own argument parser)."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from vpatch.base import Progress, VpatchError, atomic_write
from vpatch.docker import Docker, ImageInfo
from vpatch.serve import vllm_flags
from vpatch.serve.render import RunCommand

# Run by the image's python3 in a container: serve/vllm_flags.py, this very file (it prints vLLM's version and
# every option string its OpenAI server accepts, after the marker).
_MARKER = vllm_flags.MARKER
_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
_NUMBER = re.compile(r"^-\d")


@dataclass(frozen=True)
class VllmOptions:
    """What the vLLM inside one image accepts."""

    version: str
    options: frozenset[str]  # every option string, e.g. --max-model-len, -tp, --no-enforce-eager
    dests: Mapping[str, str] = field(default_factory=dict)  # option string -> the value it sets (-tp and
    # --tensor-parallel-size both set tensor_parallel_size; --enforce-eager and --no-enforce-eager enforce_eager)

    def knows(self, flag: str) -> bool:
        return self._name(flag) in self.options

    def dest(self, flag: str) -> str | None:
        return self.dests.get(self._name(flag))

    @staticmethod
    def _name(flag: str) -> str:
        # vLLM's FlexibleArgumentParser reads --max_model_len as --max-model-len.
        name = flag.split("=", 1)[0]
        return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


@dataclass(frozen=True)
class LintReport:
    entrypoint: tuple[str, ...]
    vllm_version: str
    flags: tuple[str, ...]  # the flags checked, in the order they appear


def vllm_options(docker: Docker, image: ImageInfo, ref: str, *, cache: Path,
                 progress: Progress | None = None) -> VllmOptions:
    """The flags the vLLM in `image` accepts, read by running its python3 once; cached by image id."""
    # .v2: with each option's dest (a cache from before holds only the option strings and is read again)
    path = cache / "serve" / "vllm-options" / f"{image.id.replace(':', '-')}.v2.json"
    if path.is_file():
        data = json.loads(path.read_text())
        return VllmOptions(data["version"], frozenset(data["options"]), dict(data["dests"]))
    if progress:
        progress(f"reading the vLLM flags of {ref} (imports vLLM once in a container; cached by image id)")
    program = Path(vllm_flags.__file__).read_text(encoding="utf-8")
    result = docker.execute(ref, ["python3", "-c", program], network="none", timeout=600)
    lines = [ln for ln in result.out.splitlines() if ln.startswith(_MARKER)]
    if result.returncode != 0 or not lines:
        tail = "\n".join((result.err or result.out).strip().splitlines()[-15:])
        raise VpatchError(
            f"cannot read the vLLM flags of {ref}: python3 exited with {result.returncode}\n{tail}",
            hint="the image needs python3 on PATH with vLLM importable (as the official vllm/vllm-openai has)",
        )
    data = json.loads(lines[-1][len(_MARKER):])
    atomic_write(path, json.dumps(data).encode())
    return VllmOptions(data["version"], frozenset(data["options"]), dict(data["dests"]))


def check(docker: Docker, command: RunCommand, *, definition: str, cache: Path,
          progress: Progress | None = None) -> LintReport:
    """Refuse `command` unless the image's entrypoint plus its arguments start vLLM's server exactly once
    and every flag exists in the image's vLLM. Runs only the image's python3; touches no container."""
    image = docker.image(command.image, missing_hint=f"build it (vpatch build {definition}) or pass --image")
    source = f"images/{definition}.yaml"
    flags_from = _check_entrypoint(image.entrypoint, command.args, source)
    options = vllm_options(docker, image, command.image, cache=cache, progress=progress)
    flags = [a for a in command.args[flags_from:] if a.startswith("-") and not _NUMBER.match(a)]
    unknown = [f for f in flags if not options.knows(f)]
    if unknown:
        lines = []
        for flag in unknown:
            near = difflib.get_close_matches(flag.split("=", 1)[0], sorted(options.options), n=1)
            lines.append(f"{flag}" + (f" (did you mean {near[0]}?)" if near else ""))
        raise VpatchError(
            f"vLLM {options.version} in {command.image} has no flag " + ", ".join(lines),
            hint=f"fix or remove it in {source} (serve: or serve.extra_args); nothing was started or stopped",
        )
    _check_once(options, flags, command.image, source)
    return LintReport(entrypoint=image.entrypoint, vllm_version=options.version, flags=tuple(flags))


def _check_once(options: VllmOptions, flags: Sequence[str], image: str, source: str) -> None:
    """One value per setting, by the image's own parser: an alias (`-tp`) beside its long form is the same
    flag given twice (the yaml check sees spellings; only the image knows its aliases)."""
    seen: dict[str, str] = {}
    for flag in flags:
        dest = options.dest(flag)
        if dest is None:
            continue
        first = seen.setdefault(dest, flag)
        if first != flag or flags.count(flag) > 1:
            raise VpatchError(
                f"{first} and {flag} both set vLLM {options.version}'s {dest} (in {image}): vLLM would take "
                "the last one silently", hint=f"give it once in {source}; nothing was started or stopped")


def serves(words: Sequence[str]) -> int | None:
    """Where vLLM's server arguments begin in an entrypoint+command, or None when these words start no
    server: after `vllm serve` or `python -m vllm.entrypoints.openai.api_server`. Words are compared
    normalised (case, surrounding spaces): `Serve` or `serve ` in a yaml is the same mistake as `serve`."""
    for i, word in enumerate(words):
        if PurePosixPath(_normal(word)).name == "vllm" and i + 1 < len(words) and _normal(words[i + 1]) == "serve":
            return i + 2
        if _normal(word) == _SERVER_MODULE and i > 0 and words[i - 1] == "-m":
            return i + 1
    return None


def _normal(word: str) -> str:
    return word.strip().casefold()


def _says_serve(words: Sequence[str]) -> bool:
    """Whether one of `words` is, or begins with, `serve` once normalised (`serve /models/x` as one word too)."""
    return any(_normal(word).split()[:1] == ["serve"] for word in words)


def _positional_head(args: Sequence[str]) -> tuple[str, ...]:
    """The words before the first flag: command and model."""
    head = []
    for word in args:
        if word.startswith("-"):
            break
        head.append(word)
    return tuple(head)


def _check_entrypoint(entrypoint: tuple[str, ...], args: tuple[str, ...], source: str) -> int:
    """The index in `args` where the server's own arguments (model, flags) begin; VpatchError otherwise."""
    shown = " ".join(entrypoint) or "(none)"
    start = serves(entrypoint)
    if start == len(entrypoint):
        # The entrypoint already serves: the arguments must begin with the model, not another `serve`.
        if _says_serve(_positional_head(args)) or serves(args) is not None:
            extra = "vllm serve" if serves(args) is not None else next(
                w for w in _positional_head(args) if _says_serve([w]))
            raise VpatchError(
                f"the image's entrypoint is already `{shown}`: these arguments would run "
                f"`{shown} {' '.join(args[:3])} …` and vLLM refuses it (a crash loop under a restart policy)",
                hint=f"remove `{extra}` from serve.command (or serve.model) in {source}: the model comes first",
            )
        return 0
    if start is not None:
        raise VpatchError(
            f"the image's entrypoint `{shown}` starts vLLM with arguments of its own; vpatch cannot append to it",
            hint="use an image whose entrypoint ends in `vllm serve` (the official vllm/vllm-openai's does)",
        )
    inner = serves(args)
    if inner is None:
        raise VpatchError(
            f"the image's entrypoint `{shown}` does not start vLLM's server, and serve.command does not either",
            hint=f"set serve.command: [vllm, serve] in {source}",
        )
    if serves(args[inner:]) is not None or _says_serve(_positional_head(args[inner:])):
        raise VpatchError(
            f"serve.command starts vLLM's server twice: `{' '.join(args[:inner + 2])} …`",
            hint=f"say `serve` once in serve.command in {source}",
        )
    return inner
