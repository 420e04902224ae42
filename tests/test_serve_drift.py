"""Drift rules on real containers that are created, never started (docker inspect is all --diff reads).

The image is an empty root filesystem with the official entrypoint, an environment default and vpatch's
pin labels; test_serve.py finds drift on the running vLLM server itself.
"""

from __future__ import annotations

import io
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serverimage import tiny_serve, tiny_yaml

from vpatch.config import Pin
from vpatch.definition import ImageDefinition
from vpatch.image.docker import Docker
from vpatch.serve import drift
from vpatch.serve.render import for_definition

pytestmark = pytest.mark.docker

PIN = Pin("v0.29.0", "ff9cd35769848aaabb41d2b2f0caada8b431f17e")


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    docker = Docker.connect()
    empty = io.BytesIO()
    with tarfile.open(fileobj=empty, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("README"), io.BytesIO(b""))
    ref = f"vpatch-serve-test/drift-base:{uuid.uuid4().hex[:8]}"
    empty.seek(0)
    docker.import_rootfs(empty, ref, [
        'ENTRYPOINT ["vllm", "serve"]', "ENV BASE_DEFAULT=1",
        f"LABEL io.vpatch.pin.ref={PIN.ref} io.vpatch.pin.commit={PIN.commit} org.opencontainers.image.version=0.29.0",
    ])
    yield ref
    docker.remove_image(ref)


@pytest.fixture
def container(image: str) -> Iterator[str]:
    name = f"vpatch-serve-test-drift-{uuid.uuid4().hex[:8]}"
    yield name
    Docker.connect().remove_container(name)


def definition(tmp_path: Path, image: str, serve: dict[str, Any]) -> ImageDefinition:
    return ImageDefinition.parse(tiny_yaml(image, serve), name="tiny", path=tmp_path / "images" / "tiny.yaml",
                                 source="images/tiny.yaml")


def create(image: str, tmp_path: Path, serve: dict[str, Any]) -> None:
    """Create (not start) the container exactly as `vpatch serve` would run it."""
    argv = list(for_definition(definition(tmp_path, image, serve)).argv)
    assert argv[1:3] == ["run", "--detach"]
    Docker.connect().run_cli([argv[0], "create", *argv[3:]])


def test_the_same_yaml_has_no_drift_and_the_labels_are_shown(image: str, container: str, tmp_path: Path) -> None:
    serve = tiny_serve(8000, container, max_num_seqs=4)
    create(image, tmp_path, serve)
    report = drift.diff(Docker.connect(), definition(tmp_path, image, serve), pin=PIN)
    assert report.drifts == ()
    assert report.running_image.startswith(f"{image} (") and "version=0.29.0" in report.running_image
    assert f"ref={PIN.ref}" in report.running_image


def test_flags_compare_by_meaning_and_image_defaults_are_not_drift(image: str, container: str, tmp_path: Path) -> None:
    # The container was started with the underscore and --flag=value spellings vLLM also accepts.
    ran = tiny_serve(8000, container, max_model_len=None, extra_args=["--max_model_len=1024"])
    create(image, tmp_path, ran)
    report = drift.diff(Docker.connect(), definition(tmp_path, image, tiny_serve(8000, container)))
    assert report.drifts == ()


def test_every_kind_of_drift_is_named(image: str, container: str, tmp_path: Path) -> None:
    ran = tiny_serve(8000, container, env={"VLLM_LOGGING_LEVEL": "INFO", "HAND_SET": "x"}, enforce_eager=None)
    create(image, tmp_path, ran)
    now = tiny_serve(8000, container, max_num_seqs=8, env={"VLLM_LOGGING_LEVEL": "INFO"})
    now["container"] = {**now["container"], "restart": "unless-stopped", "shm_size": "2g"}
    report = drift.diff(Docker.connect(), definition(tmp_path, image, now), pin=Pin("v0.30.0", "a" * 40))
    found = {d.what: (d.yaml, d.running) for d in report.drifts}
    assert found == {
        "--max-num-seqs": ("8", "2"),
        "--enforce-eager": ("(set)", "(absent)"),
        "env HAND_SET": ("(absent)", "x"),
        "restart policy": ("unless-stopped", "no"),
        "shm size": (str(2 * 1024**3), str(1024**3)),
        "image pin": (f"v0.30.0 ({'a' * 12}, vpatch.yaml)", f"{PIN.ref} ({PIN.commit[:12]})"),
    }
