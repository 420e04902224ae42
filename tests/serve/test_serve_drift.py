"""Drift rules on real containers started exactly as `vpatch serve` would run them (docker inspect is all
--diff reads), from a stand-in image (tests/helpers/placeholder.py: the official entrypoint, a binary that waits),
with an environment default and vpatch's pin labels; test_serve.py finds drift on the running vLLM server.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import placeholder
from helpers.serverimage import tiny_serve, tiny_yaml

from vpatch.config.definition import ImageDefinition
from vpatch.config.project import Pin
from vpatch.docker import Docker
from vpatch.serve import drift
from vpatch.serve.render import for_definition

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("serve-drift")]  # one worker builds the module's image

PIN = Pin("v0.29.0", "ff9cd35769848aaabb41d2b2f0caada8b431f17e")


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    docker = Docker.connect()
    ref = placeholder.build(docker, [
        "ENV BASE_DEFAULT=1",
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


def create(image: str, tmp_path: Path, serve: dict[str, Any], *, start: bool = True, options: tuple[str, ...] = ()) -> None:
    """Run (or only create) the container exactly as `vpatch serve` would, with `options` added to docker's."""
    argv = list(for_definition(definition(tmp_path, image, serve)).argv)
    assert argv[1:3] == ["run", "--detach"]
    verb = ["run", "--detach"] if start else ["create"]
    rest = argv[3:]
    if "--health-cmd" in options:
        # the test's own health check replaces the rendered one (that one runs python3 through /bin/sh, which
        # the stand-in image does not have: docker would keep the later --health-cmd, the rendered one)
        rest = [a for i, a in enumerate(rest) if not a.startswith("--health-")
                and not (i > 0 and rest[i - 1].startswith("--health-"))]
    Docker.connect().run_cli([argv[0], *verb, *options, *rest])


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


def test_the_containers_memory_limit_is_compared(image: str, container: str, tmp_path: Path) -> None:
    """The deploy's memory check measures free memory against the container's limit: a container started by
    hand without the yaml's --memory, or with another, is drift."""
    serve = tiny_serve(8000, container)
    create(image, tmp_path, serve, options=("--memory", "300m"))  # started by hand with a limit of its own
    limited = {**serve, "container": {**serve["container"], "memory": "512m"}}
    report = drift.diff(Docker.connect(), definition(tmp_path, image, limited))
    found = {d.what: (d.yaml, d.running) for d in report.drifts}
    assert found == {"memory limit": ("536,870,912 bytes (512 MiB)", "314,572,800 bytes (300 MiB)")}
    assert not [d for d in drift.diff(Docker.connect(), definition(tmp_path, image, serve)).drifts
                if d.what != "memory limit"]
    same = drift.diff(Docker.connect(), definition(tmp_path, image, {**serve, "container": {**serve["container"],
                                                                                            "memory": "300m"}}))
    assert same.drifts == ()


def wait_for(docker: Docker, name: str, what: str, test: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not test(docker.container(name)):
        assert time.monotonic() < deadline, f"{name} never became {what}: {docker.container(name)}"
        time.sleep(0.3)


def state_drift(image: str, container: str, tmp_path: Path, serve: dict[str, Any]) -> list[tuple[str, str]]:
    report = drift.diff(Docker.connect(), definition(tmp_path, image, serve))
    return [(d.yaml, d.running) for d in report.drifts if d.what == "state"]


def test_a_running_container_has_no_state_drift(image: str, container: str, tmp_path: Path) -> None:
    serve = tiny_serve(8000, container)
    create(image, tmp_path, serve)
    assert state_drift(image, container, tmp_path, serve) == []


def test_a_stopped_container_is_drift(image: str, container: str, tmp_path: Path) -> None:
    serve = tiny_serve(8000, container)
    create(image, tmp_path, serve)
    docker = Docker.connect()
    docker.stop_container(container)
    wait_for(docker, container, "exited", lambda c: c.status == "exited")
    (found,) = state_drift(image, container, tmp_path, serve)
    assert found[0] == "running" and found[1].startswith("exited (exit code ")


def test_a_container_never_started_is_drift(image: str, container: str, tmp_path: Path) -> None:
    serve = tiny_serve(8000, container)
    create(image, tmp_path, serve, start=False)
    assert state_drift(image, container, tmp_path, serve) == [("running", "created")]


def test_a_restarting_container_is_drift(image: str, container: str, tmp_path: Path) -> None:
    serve = tiny_serve(8000, container, extra_args=["--exit-now"])  # the stand-in exits 3 at once
    serve["container"]["restart"] = "always"
    create(image, tmp_path, serve)
    docker = Docker.connect()
    # docker alternates "restarting" (a back-off that doubles from 100 ms) and a "running" of a few milliseconds;
    # a read counts only when the container was restarting, with the same restart count, before and after it.
    wait_for(docker, container, "restarted three times", lambda c: c.restart_count >= 3)
    for _ in range(50):
        wait_for(docker, container, "restarting", lambda c: c.status == "restarting")
        before = docker.container(container)
        found_now = state_drift(image, container, tmp_path, serve)
        after = docker.container(container)
        assert before is not None and after is not None
        if after.status == "restarting" and after.restart_count == before.restart_count:
            break
    else:
        pytest.fail(f"{container} was never read inside one restarting back-off")
    (found,) = found_now
    assert found[1].startswith("restarting (restart ") and "last exit code 3" in found[1]


def test_an_unhealthy_container_is_drift(image: str, container: str, tmp_path: Path) -> None:
    serve = tiny_serve(8000, container)
    create(image, tmp_path, serve, options=("--health-cmd", "vllm --unhealthy", "--health-interval", "1s",
                                             "--health-retries", "1"))
    wait_for(docker := Docker.connect(), container, "unhealthy", lambda c: c.health == "unhealthy")
    assert state_drift(image, container, tmp_path, serve) == [("running", "running, but its health check says unhealthy")]
    assert docker.container(container).status == "running"  # type: ignore[union-attr]


def test_a_health_check_not_the_rendered_one_is_drift(image: str, container: str, tmp_path: Path) -> None:
    """Started by hand with another health check (or an older vpatch's): --diff names the command and timings."""
    serve = tiny_serve(8000, container)
    create(image, tmp_path, serve, options=("--health-cmd", "curl -f localhost:8000/health", "--health-interval", "1s",
                                             "--health-retries", "1"))
    report = drift.diff(Docker.connect(), definition(tmp_path, image, serve))
    found = {d.what: (d.yaml, d.running) for d in report.drifts if d.what.startswith("health")}
    assert found["health check"] == ("vpatch's liveness check (serve/alive.py of this vpatch)",
                                     "another command: CMD-SHELL curl -f localhost:8000/health")
    assert found["health interval (s)"] == ("10", "1") and found["health retries"] == ("3", "1")
    # the timeout and start period were left out by hand: docker's defaults (0, "not set") differ too
    assert found["health timeout (s)"] == ("30", "0") and found["health start period (s)"][1] == "0"


def test_the_same_liveness_check_with_another_port_is_named_as_such(image: str, container: str, tmp_path: Path) -> None:
    ran = tiny_serve(8000, container)
    create(image, tmp_path, ran)
    report = drift.diff(Docker.connect(), definition(tmp_path, image, tiny_serve(8001, container)))
    found = {d.what: d.running for d in report.drifts}
    assert found["health check"] == "vpatch's liveness check, with other arguments (port, host or timeouts)"


def test_serve_diff_on_a_stopped_container_exits_7_and_says_so(image: str, container: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from vpatch.commands.cli import app

    serve = tiny_serve(8000, container)
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "tiny.yaml").write_text(tiny_yaml(image, serve))
    (tmp_path / "vpatch.yaml").write_text("pin:\n  ref: v0.29.0\n")
    create(image, tmp_path, serve)
    Docker.connect().stop_container(container)
    result = CliRunner().invoke(app, ["-C", str(tmp_path), "serve", "tiny", "--diff"])
    assert result.exit_code == 7, result.output
    assert f"{container} differs from images/tiny.yaml:" in result.stdout and "running: exited (exit code" in result.stdout
    assert "runs exactly what" not in result.stdout
