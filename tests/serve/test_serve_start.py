"""A `docker run` the daemon refuses names the yaml key and leaves no container behind; a command too long
for the kernel says so; on the real docker daemon, with the stand-in server image (tests/helpers/placeholder.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import placeholder
from helpers.serverimage import tiny_serve, tiny_yaml
from typer.testing import CliRunner

from vpatch.base import process
from vpatch.base.errors import ProcessError, VpatchError
from vpatch.commands.cli import app
from vpatch.config.definition import ImageDefinition
from vpatch.docker import Docker, DockerError
from vpatch.serve import run
from vpatch.serve.render import for_definition

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("serve-start")]  # one worker builds the module's image


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    docker = Docker.connect()
    ref = placeholder.build(docker)
    yield ref
    docker.remove_image(ref)


@pytest.fixture
def name() -> Iterator[str]:
    container = f"vpatch-serve-test-start-{uuid.uuid4().hex[:8]}"
    yield container
    Docker.connect().remove_container(container)


def start(tmp_path: Path, image: str, container: str, **options: object) -> VpatchError:
    serve = tiny_serve(8000, container)
    serve["container"] = {**serve["container"], **options}
    definition = ImageDefinition.parse(tiny_yaml(image, serve), name="tiny", path=tmp_path / "images" / "tiny.yaml",
                                       source="images/tiny.yaml").validate()
    with pytest.raises(VpatchError) as info:
        run.start(Docker.connect(), for_definition(definition))
    return info.value


@pytest.mark.parametrize(("option", "value", "key", "said"), [
    ("ipc", "hots", "serve.container.ipc", "Invalid IPC mode: hots"),
    ("network", "hots", "serve.container.network", "network hots not found"),
])
def test_a_refused_docker_run_names_the_key_and_leaves_no_container(
        tmp_path: Path, image: str, name: str, option: str, value: str, key: str, said: str) -> None:
    error = start(tmp_path, image, name, **{option: value})
    assert said in error.message and f"check {key} ({value}) in images/tiny.yaml" in error.message
    assert "was removed" in error.message and error.hint == f"fix {key} in images/tiny.yaml"
    assert Docker.connect().container(name) is None  # the `Created` container would block the next serve


def test_the_next_start_after_a_refused_one_works(tmp_path: Path, image: str, name: str) -> None:
    start(tmp_path, image, name, ipc="hots")
    serve = tiny_serve(8000, name)
    definition = ImageDefinition.parse(tiny_yaml(image, serve), name="tiny", path=tmp_path / "images" / "tiny.yaml",
                                       source="images/tiny.yaml")
    docker = Docker.connect()
    cid = run.start(docker, for_definition(definition))
    info = docker.container(name)
    assert info is not None and info.id == cid and info.status == "running"


def test_a_container_of_someone_else_is_never_removed(tmp_path: Path, image: str, name: str) -> None:
    """The name is taken (even by a never-started container with this definition's label, as an earlier
    vpatch could have left): docker refuses, and that container stays."""
    from vpatch.serve.render import LABEL_DEFINITION

    docker = Docker.connect()
    docker.run_cli(["docker", "create", "--name", name, "--label", f"{LABEL_DEFINITION}=tiny", image])
    error = start(tmp_path, image, name)
    assert "is already in use" in error.message and "check serve.container.name" in error.message
    assert "was removed" not in error.message
    assert docker.container(name) is not None


def test_an_argument_list_too_long_is_named_not_a_missing_docker(tmp_path: Path) -> None:
    serve = tiny_serve(8000, "vpatch-too-long", model="/models/" + "x" * 200_000)
    definition = ImageDefinition.parse(tiny_yaml("local/x:1", serve), name="tiny", path=tmp_path / "tiny.yaml",
                                       source="images/tiny.yaml")
    with pytest.raises(VpatchError) as info:
        run.start(Docker.connect(), for_definition(definition))
    assert "the argument list is too long" in info.value.message and "200,008 bytes" in info.value.message
    assert "not installed" not in info.value.message
    with pytest.raises(ProcessError) as raw:
        process.run(["true", "y" * 200_000])
    assert "argument 1 is 200,000 bytes" in raw.value.message and len(raw.value.message) < 300


def test_a_missing_docker_cli_is_still_named(tmp_path: Path) -> None:
    with pytest.raises(DockerError, match=r"the docker CLI \(/nonexistent/docker\) is not installed"):
        Docker.connect().run_cli(["/nonexistent/docker", "ps"])


@pytest.mark.parametrize("ref", ["", "  "])
def test_verify_of_an_empty_image_name_is_a_clear_error(tmp_path: Path, ref: str) -> None:
    (tmp_path / "vpatch.yaml").write_text("pin:\n  ref: v1.0\n")
    result = CliRunner().invoke(app, ["-C", str(tmp_path), "verify", ref])
    assert result.exit_code == 1
    assert "internal error" not in result.output and "Traceback" not in result.output
    assert f"error: no image named ({ref!r} is empty)" in result.output and "hint:" in result.output
