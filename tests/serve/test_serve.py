"""vpatch serve against the real vLLM 0.32.0 CPU server image in docker (no fake server).

The server is the session's production (`tiny_production`, tests/helpers/deployhost.py: started by `vpatch serve` from
its yaml, shared with the deploy tests); the refusals start nothing (they are checked to leave that server as
it was), and the drift cases compare the yaml, edited, with that running server. The server that dies at
start and vLLM's own `serve serve` refusal run containers of their own: they are about a start that fails.
"""

from __future__ import annotations

import json
import shlex
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers.deployhost import Host
from helpers.serverimage import SERVED_NAME, free_port, tiny_serve, unique_name, write_project
from typer.testing import CliRunner

from vpatch.base.errors import ExitCode
from vpatch.commands.cli import app
from vpatch.docker import Docker
from vpatch.serve import alive
from vpatch.serve.render import health_source

pytestmark = [pytest.mark.docker, pytest.mark.vllm_server]


class Served:
    def __init__(self, host: Host) -> None:
        self.host, self.root, self.image, self.port, self.name = host, host.root, host.image, host.port, host.container
        self.cache, self.result = Path(host.env["VPATCH_CACHE"]), host.serve_result

    def serve_section(self, **overrides: Any) -> dict[str, Any]:
        return self.host.serve_section(**overrides)

    def vpatch(self, *args: str, serve: dict[str, Any] | None = None) -> Any:
        write_project(self.root, self.image, serve or self.serve_section())
        return CliRunner().invoke(app, ["-C", str(self.root), *args])


@pytest.fixture
def served(tiny_production: Host, monkeypatch: pytest.MonkeyPatch) -> Served:
    """The shared production server, started by `vpatch serve tiny`; its output is kept as `result`."""
    monkeypatch.setenv("VPATCH_CACHE", tiny_production.env["VPATCH_CACHE"])  # the lint's flag cache, shared
    return Served(tiny_production)


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return int(response.status), response.read()


def test_serve_starts_the_yaml_and_it_becomes_healthy(served: Served) -> None:
    assert served.result.exit_code == 0, served.result.output
    assert "is healthy after" in served.result.stdout
    assert "known to vLLM 0.32.0" in served.result.stdout
    status, _ = get(f"http://127.0.0.1:{served.port}/health")
    assert status == 200
    _, body = get(f"http://127.0.0.1:{served.port}/v1/models")
    models = json.loads(body)["data"]
    assert [m["id"] for m in models] == [SERVED_NAME] and models[0]["max_model_len"] == 1024
    logs = Docker.connect().container_logs(served.name)
    assert "CPU KV cache size: 8,192 tokens" in logs  # KV_NORMAL: 8 MiB at 1 KiB a token


def test_print_is_exactly_what_ran(served: Served) -> None:
    printed = served.vpatch("serve", "tiny", "--print")
    assert printed.exit_code == 0, printed.output
    run, update = printed.stdout.splitlines()
    argv = shlex.split(run)
    image_at = argv.index(served.image)
    info = Docker.connect().container(served.name)
    assert info is not None and info.status == "running"
    # What followed the image is the container's command, word for word, after the image's entrypoint.
    assert list(info.args) == argv[image_at + 1:]
    assert list(info.entrypoint) == ["vllm", "serve"]
    assert info.image_ref == served.image
    assert info.image_id == Docker.connect().image(served.image).id
    # Every option before the image is what the container runs with.
    options = argv[3:image_at]
    pairs = list(zip(options[::2], options[1::2]))
    assert ("--name", served.name) in pairs and info.name == served.name
    # Started with restart no, given the yaml's policy once alive: the second line, and what the container has now.
    assert ("--restart", "no") in pairs and info.restart_policy == "unless-stopped"
    assert update == f"docker update --restart unless-stopped {served.name}   # once alive"
    assert ("--network", "host") in pairs and info.network_mode == "host"
    assert ("--shm-size", "1g") in pairs and info.shm_size == 1024**3
    envs = [v for k, v in pairs if k == "--env"]
    assert envs == ["VLLM_LOGGING_LEVEL=INFO"] and set(envs) <= set(info.env)
    labels = [v for k, v in pairs if k == "--label"]
    assert labels == ["io.vpatch.serve.definition=tiny"] and info.labels["io.vpatch.serve.definition"] == "tiny"
    # The health check docker runs is the printed one: serve/alive.py's source, given to the image's python3.
    health = dict(pairs)["--health-cmd"]
    assert info.health_test == ("CMD-SHELL", health)
    assert health_source(health) == (Path(alive.__file__)).read_text()  # the very file, compressed on one line
    assert ("--health-start-period", "600s") in pairs  # serve.health_timeout: a load is not a failure
    assert {k for k, _ in pairs} == {"--name", "--label", "--restart", "--shm-size", "--network", "--env", "--health-cmd",
                                     "--health-interval", "--health-timeout", "--health-retries", "--health-start-period"}


def test_serve_repeated_after_a_serving_entrypoint_is_refused_before_anything_starts(served: Served) -> None:
    docker = Docker.connect()
    before = docker.container(served.name)
    other = unique_name("vpatch-serve-test-again")
    result = served.vpatch("serve", "tiny", serve=tiny_serve(free_port(), other, command=["serve"]))
    assert result.exit_code == 1, result.output
    assert "the image's entrypoint is already `vllm serve`" in result.output
    assert "vllm serve serve /models/tiny-qwen3" in result.output
    assert "hint: remove `serve` from serve.command" in result.output
    assert docker.container(other) is None  # nothing was created
    after = docker.container(served.name)
    assert before is not None and after is not None and after.id == before.id and after.started_at == before.started_at


def test_vllm_itself_refuses_serve_serve(vllm_server_image: str) -> None:
    """What the lint prevents is real: this image's `vllm serve` exits on `serve MODEL`, as the incident's did."""
    result = Docker.connect().execute(vllm_server_image, ["vllm", "serve", "serve", "/models/tiny-qwen3"],
                                      network="none", timeout=300)
    assert result.returncode == 2
    assert "unrecognized arguments: /models/tiny-qwen3" in result.err


# vLLM's own check of its model-info cache (registry.py's _LazyRegisteredModel), in the image's venv: the hash of the
# model class's source file, and the cached info if the file under VLLM_CACHE_ROOT/modelinfos matches it.
_MODELINFO_CHECK = """
import os
from pathlib import Path
import vllm.model_executor.models.registry as registry
model = registry.ModelRegistry.models["Qwen3ForCausalLM"]
source = Path(registry.__file__).parent / (model.module_name.rsplit(".", 1)[1] + ".py")
for root in (None, "/tmp/empty"):  # vllm.envs reads VLLM_CACHE_ROOT at each use
    if root:
        os.environ["VLLM_CACHE_ROOT"] = root
    info = model._load_modelinfo_from_cache(model._get_modelinfo_module_hash(source))
    print("cache", root or "default", "hit" if info is not None else "miss")
"""


def test_the_image_carries_a_model_info_cache_that_vllm_takes(vllm_server_image: str) -> None:
    """Each server start reads the model class's info from the image (scripts/testserver/warm-modelinfo.py) instead
    of inspecting it in a subprocess of its own (8 s a start: scripts/bench-server-start). A file whose hash vLLM
    no longer matches would only make the starts slower, silently: so vLLM's own check reads it here, and misses
    where the folder is empty."""
    taken = Docker.connect().execute(vllm_server_image, ["/opt/vllm/bin/python", "-c", _MODELINFO_CHECK],
                                     network="none", timeout=300)
    assert taken.returncode == 0, taken.err
    assert taken.out.splitlines()[-2:] == ["cache default hit", "cache /tmp/empty miss"], taken.out + taken.err


def test_unknown_flag_is_refused_naming_flag_and_version_before_the_old_container_is_touched(served: Served) -> None:
    docker = Docker.connect()
    before = docker.container(served.name)
    # --replace would stop the running server, but only after the lint: the lint refuses first.
    bad = served.serve_section(extra_args=["--max-modle-len", "512"])
    result = served.vpatch("serve", "tiny", "--replace", serve=bad)
    assert result.exit_code == 1, result.output
    assert "vLLM 0.32.0 in " + served.image + " has no flag --max-modle-len (did you mean --max-model-len?)" in result.output
    assert "nothing was started or stopped" in result.output
    after = docker.container(served.name)
    assert before is not None and after is not None
    assert (after.id, after.status, after.started_at) == (before.id, "running", before.started_at)


def test_an_existing_container_is_not_replaced_without_replace(served: Served) -> None:
    result = served.vpatch("serve", "tiny")
    assert result.exit_code == 1
    assert f"a container named {served.name} exists (running" in result.output and "--replace" in result.output


def test_diff_is_clean_then_finds_max_model_len_env_and_image_drift(served: Served, tmp_path: Path) -> None:
    clean = served.vpatch("serve", "tiny", "--diff")
    assert clean.exit_code == 0, clean.output
    assert "runs exactly what images/tiny.yaml says" in clean.output

    longer = served.vpatch("serve", "tiny", "--diff", "--json", serve=served.serve_section(max_model_len=2048))
    assert longer.exit_code == ExitCode.DRIFT, longer.output
    drifts = json.loads(longer.stdout)["drifts"]
    assert drifts == [{"what": "--max-model-len", "yaml": "2048", "running": "1024"}]

    env = served.vpatch("serve", "tiny", "--diff",
                        serve=served.serve_section(env={"VLLM_LOGGING_LEVEL": "DEBUG"}))
    assert env.exit_code == ExitCode.DRIFT
    assert "env VLLM_LOGGING_LEVEL" in env.stdout and "yaml: DEBUG" in env.stdout and "running: INFO" in env.stdout

    # Another image: the same server with one more label, as a rebuilt image would differ.
    (tmp_path / "Dockerfile").write_text(f"FROM {served.image}\n")
    other = f"vpatch-serve-test/drift:{uuid.uuid4().hex[:8]}"
    docker = Docker.connect()
    docker.build(tmp_path, tag=other, buildargs={}, labels={"io.vpatch.content": "rebuilt"})
    try:
        moved = served.vpatch("serve", "tiny", "--diff", "--image", other)
        assert moved.exit_code == ExitCode.DRIFT, moved.output
        assert "image" in moved.stdout and f"yaml: {other}" in moved.stdout and "content=rebuilt" in moved.stdout
        assert f"running: {served.image}" in moved.stdout and "version=0.32.0" in moved.stdout
        assert "--max-model-len" not in moved.stdout  # only the image moved
    finally:
        docker.remove_image(other)


def test_a_server_that_dies_at_start_is_stopped_not_left_restarting(served: Served) -> None:
    """The incident's lane restarted every second for hours: a start that fails ends stopped, restart policy no,
    with vLLM's own reason in the error, and docker never restarted it (it starts with restart no and gets the
    yaml's unless-stopped only once alive): one start. Here: a KV budget of 512 tokens for max_model_len 1024."""
    docker = Docker.connect()
    name = unique_name("vpatch-serve-test-dies")
    dying = tiny_serve(free_port(), name, kv_cache_memory_bytes=512 * 1024)
    dying["container"]["restart"] = "unless-stopped"
    try:
        result = served.vpatch("serve", "tiny", serve=dying)
        assert result.exit_code == 1, result.output
        assert f"{name} exited with code " in result.output
        assert ": ValueError: To serve at least one request" in result.output, result.output
        assert "restart policy no" in result.output
        info = docker.container(name)
        assert info is not None and info.status == "exited" and info.restart_policy == "no"
        assert info.restart_count == 0
    finally:
        docker.remove_container(name)
