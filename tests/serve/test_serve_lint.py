"""The lint's rules on small real images (an empty root filesystem with a given entrypoint).

The vLLM flags of such an image are put in the lint's cache by image id, as a first lint would have
stored them; test_serve.py reads them from the real vLLM 0.32.0 image instead.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from vpatch.base.errors import VpatchError
from vpatch.config.serve import ContainerOptions, ServeConfig
from vpatch.docker import Docker
from vpatch.serve import lint
from vpatch.serve.render import render

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("serve-lint")]  # one worker builds the module's images

OPTIONS = ["--port", "--max-model-len", "--enforce-eager", "--no-enforce-eager", "--kv-cache-dtype", "-tp",
           "--tensor-parallel-size", "--served-model-name"]
# What vLLM's parser says each sets (as the lint's python3 dump records it): an alias and a --no- form share it.
DESTS = {**{o: o.lstrip("-").replace("-", "_") for o in OPTIONS}, "-tp": "tensor_parallel_size",
         "--no-enforce-eager": "enforce_eager"}


@pytest.fixture(scope="module")
def images() -> Iterator[dict[str, str]]:
    """Empty images whose entrypoints are the official one, vLLM's module, a shell, and none."""
    docker = Docker.connect()
    empty = io.BytesIO()
    with tarfile.open(fileobj=empty, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("README"), io.BytesIO(b""))
    kinds = {
        "serve": '["vllm", "serve"]',
        "module": '["python3", "-m", "vllm.entrypoints.openai.api_server"]',
        "shell": '["/bin/sh", "-c"]',
    }
    made = {}
    for kind, entrypoint in [*kinds.items(), ("none", None)]:
        ref = f"vpatch-serve-test/entrypoint:{kind}"
        empty.seek(0)
        changes = [f"ENTRYPOINT {entrypoint}"] if entrypoint else []
        docker.import_rootfs(io.BytesIO(empty.getvalue()), ref, [*changes, f"LABEL kind={kind}"])
        made[kind] = ref
    yield made
    for ref in made.values():
        docker.remove_image(ref)


def lint_of(images: dict[str, str], kind: str, cache: Path, **fields: object) -> lint.LintReport:
    docker = Docker.connect()
    image = docker.image(images[kind])
    path = cache / "serve" / "vllm-options" / f"{image.id.replace(':', '-')}.v2.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": "0.32.0", "options": OPTIONS, "dests": DESTS}))
    serve = ServeConfig(**{"model": "/models/m", "container": ContainerOptions(name="x"), **fields})  # type: ignore[arg-type]
    return lint.check(docker, render(serve, images[kind], definition="tiny"), definition="tiny", cache=cache)


def test_official_entrypoint_takes_the_model_first(images: dict[str, str], tmp_path: Path) -> None:
    report = lint_of(images, "serve", tmp_path, enforce_eager=False,
                     extra_args=("--max_model_len", "1024", "--kv-cache-dtype=fp8", "-tp", "1"))
    assert report.vllm_version == "0.32.0" and report.entrypoint == ("vllm", "serve")
    # underscores and --flag=value are what vLLM's parser accepts too; numbers are values, not flags
    assert report.flags == ("--port", "--no-enforce-eager", "--max_model_len", "--kv-cache-dtype=fp8", "-tp")


@pytest.mark.parametrize(("fields", "pair"), [
    ({"tensor_parallel_size": 2, "extra_args": ("-tp", "2")}, "--tensor-parallel-size and -tp"),
    ({"max_model_len": 1024, "extra_args": ("--max_model_len", "2048")}, "--max-model-len and --max_model_len"),
    ({"enforce_eager": True, "extra_args": ("--no-enforce-eager",)}, "--enforce-eager and --no-enforce-eager"),
])
def test_a_setting_given_twice_is_refused_by_the_images_own_parser(images: dict[str, str], tmp_path: Path,
                                                                   fields: dict[str, object], pair: str) -> None:
    """Aliases only the image's vLLM knows (-tp) included; a config built in code is checked as the yaml is."""
    with pytest.raises(VpatchError) as info:
        lint_of(images, "serve", tmp_path, **fields)
    assert f"{pair} both set vLLM 0.32.0's" in info.value.message
    assert info.value.hint is not None and "nothing was started or stopped" in info.value.hint


@pytest.mark.parametrize("command", [("serve",), ("vllm", "serve")])
def test_serve_after_a_serving_entrypoint_is_refused_with_the_fix(images: dict[str, str], tmp_path: Path,
                                                                   command: tuple[str, ...]) -> None:
    with pytest.raises(VpatchError) as info:
        lint_of(images, "serve", tmp_path, command=command)
    assert "already `vllm serve`" in info.value.message
    assert f"would run `vllm serve {' '.join(command)} /models/m" in info.value.message
    assert info.value.hint is not None and info.value.hint.startswith(f"remove `{' '.join(command)}` from serve.command")


@pytest.mark.parametrize(("fields", "word"), [
    ({"command": ("Serve",)}, "Serve"),
    ({"command": ("serve ",)}, "serve "),
    ({"command": (" SERVE",)}, " SERVE"),
    ({"model": "serve /models/x"}, "serve /models/x"),
    ({"model": "Serve"}, "Serve"),
])
def test_serve_is_found_in_any_case_and_with_spaces(images: dict[str, str], tmp_path: Path,
                                                    fields: dict[str, object], word: str) -> None:
    """The argv normalised: what the yaml check refuses first is refused here too, for a config built in code."""
    with pytest.raises(VpatchError) as info:
        lint_of(images, "serve", tmp_path, **fields)
    assert "already `vllm serve`" in info.value.message
    assert info.value.hint is not None and info.value.hint.startswith(f"remove `{word}` from serve.command")


@pytest.mark.parametrize("command", [("vllm", "serve", "Serve"), ("vllm", "SERVE ", "serve")])
def test_serve_twice_after_a_plain_entrypoint_in_any_case(images: dict[str, str], tmp_path: Path,
                                                          command: tuple[str, ...]) -> None:
    with pytest.raises(VpatchError, match="starts vLLM's server twice"):
        lint_of(images, "shell", tmp_path, command=command)


def test_the_model_named_serve_is_the_same_mistake(images: dict[str, str], tmp_path: Path) -> None:
    docker = Docker.connect()
    serve = ServeConfig(model="serve", container=ContainerOptions(name="x"))
    with pytest.raises(VpatchError, match="already `vllm serve`"):
        lint.check(docker, render(serve, images["serve"], definition="t"), definition="t", cache=tmp_path)


@pytest.mark.parametrize("kind", ["shell", "none"])
def test_an_entrypoint_that_does_not_serve_needs_serve_in_the_command(images: dict[str, str], tmp_path: Path,
                                                                     kind: str) -> None:
    with pytest.raises(VpatchError) as info:
        lint_of(images, kind, tmp_path)
    assert "does not start vLLM's server" in info.value.message
    assert info.value.hint == "set serve.command: [vllm, serve] in images/tiny.yaml"
    report = lint_of(images, kind, tmp_path, command=("vllm", "serve"), max_model_len=8)
    assert report.flags == ("--port", "--max-model-len")


def test_a_module_entrypoint_takes_the_model_first_too(images: dict[str, str], tmp_path: Path) -> None:
    assert lint_of(images, "module", tmp_path).flags == ("--port",)


def test_unknown_flags_are_all_named_with_the_version(images: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(VpatchError) as info:
        lint_of(images, "serve", tmp_path, extra_args=("--max-modle-len", "9", "--enable-magic"))
    assert info.value.message == (
        "vLLM 0.32.0 in vpatch-serve-test/entrypoint:serve has no flag "
        "--max-modle-len (did you mean --max-model-len?), --enable-magic")
    # a typed bool the version does not know in its --no- form is refused the same way
    with pytest.raises(VpatchError, match="has no flag --no-kv-cache-dtype"):
        lint_of(images, "serve", tmp_path, extra_args=("--no-kv-cache-dtype",))


def test_serves_finds_where_the_server_arguments_begin() -> None:
    assert lint.serves(["vllm", "serve"]) == 2
    assert lint.serves(["/usr/local/bin/vllm", "serve", "m"]) == 2
    assert lint.serves(["python3", "-m", "vllm.entrypoints.openai.api_server", "m"]) == 3
    assert lint.serves(["vllm", "bench"]) is None and lint.serves([]) is None
