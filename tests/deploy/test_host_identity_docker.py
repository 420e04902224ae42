"""Production is touched only by the right hand, on the real docker daemon: a rollback verifies every
container by id and labels before it acts, serve --replace never removes another definition's container
nor one a deploy holds, a port someone answers on is refused before the start, and a renamed definition
finds its unfinished deploy. The audit's cases (shared audits, serve-deploy-bad-inputs.md) by their ids.

Containers that only have to exist (the parked production, another definition's server) run the stand-in
image (tests/helpers/placeholder.py); `vpatch serve` runs its lint on the real vLLM CPU server image, and every
refusal here comes before a server would start (none of these cases needs a server that answers)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import placeholder
from helpers.serverimage import container_names, free_port, tiny_serve, write_project
from typer.testing import CliRunner

from vpatch.commands.cli import app
from vpatch.docker import ContainerInfo, Docker
from vpatch.serve.render import LABEL_DEFINITION

pytestmark = pytest.mark.docker
STARTED = "20261201-060000"


@pytest.fixture(scope="module")
def stand_in() -> Iterator[str]:
    docker = Docker.connect()
    ref = placeholder.build(docker)
    yield ref
    docker.remove_image(ref)


@pytest.fixture(scope="module")
def lint_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("identity-cache")  # the lint's flag cache, read once for the module


@dataclass
class Host:
    root: Path
    state: Path
    cache: Path
    base: str  # every container name here begins with it (removed afterwards)
    port: int
    docker: Docker

    def vpatch(self, *args: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, ["-C", str(self.root), *args],
                                    env={"VPATCH_STATE": str(self.state), "VPATCH_CACHE": str(self.cache)})
        return result.exit_code, result.output

    def start(self, image: str, suffix: str, definition: str | None, *, running: bool = True) -> ContainerInfo:
        labels = ["--label", f"{LABEL_DEFINITION}={definition}"] if definition else []
        verb = ["run", "--detach"] if running else ["create"]
        self.docker.run_cli(["docker", *verb, "--name", f"{self.base}{suffix}", *labels, image])
        info = self.docker.container(f"{self.base}{suffix}")
        assert info is not None
        return info

    def journal(self, **fields: object) -> Path:
        data = {"definition": "tiny", "container": self.base, "image": "vpatch-test/x:candidate", "phase": "checking",
                "started": STARTED, "candidate_started": True, "port": self.port, "health_timeout_s": 30, **fields}
        path = self.state / "deploy" / "tiny.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
        return path

    def state_of(self, suffix: str) -> tuple[str, str] | None:
        info = self.docker.container(f"{self.base}{suffix}")
        return (info.id, info.status) if info else None


@pytest.fixture
def host(tmp_path: Path, lint_cache: Path) -> Iterator[Host]:
    docker = Docker.connect()
    h = Host(tmp_path / "project", tmp_path / "state", lint_cache, f"vpatch-identity-{uuid.uuid4().hex[:8]}",
             free_port(), docker)
    try:
        yield h
    finally:
        for name in container_names(docker, h.base):
            docker.remove_container(name)


def test_x66_a_rollback_never_stops_a_container_that_took_the_production_name(host: Host, stand_in: str) -> None:
    """The production name is held by another definition's running server (the journal's `container`
    names it, or it took the name since): the rollback refuses, and touches neither container."""
    parked = host.start(stand_in, f"-parked-{STARTED}", "tiny", running=False)
    other = host.start(stand_in, "", "other")
    journal = host.journal(parked_id=parked.id, parked_name=parked.name, parked_restart="no")
    before = journal.read_text()
    code, out = host.vpatch("deploy", "tiny", "--rollback")
    assert code == 1 and "is not the container it recorded" in out and "nothing was touched" in out, out
    assert f"{LABEL_DEFINITION}=other" in out
    assert host.state_of("") == (other.id, "running") and host.state_of(f"-parked-{STARTED}") == (parked.id, "created")
    assert journal.read_text() == before


def test_x70f_a_parked_id_of_another_definitions_container_is_refused(host: Host, stand_in: str) -> None:
    other = host.start(stand_in, "-other", "other")
    host.journal(parked_id=other.id, parked_name=f"{host.base}-parked-{STARTED}", parked_restart="no",
                 candidate_started=False, phase="starting")
    code, out = host.vpatch("deploy", "tiny", "--rollback")
    assert code == 1 and "labelled for 'other', not 'tiny'" in out, out
    assert host.state_of("-other") == (other.id, "running")  # not renamed into production, not restarted


def test_a_candidate_of_another_deploy_is_not_stopped(host: Host, stand_in: str) -> None:
    """Killed between `docker run` and the journal write: the holder of the name is the candidate only if
    it carries this deploy's label (a `serve --replace` meanwhile put its own server there)."""
    parked = host.start(stand_in, f"-parked-{STARTED}", "tiny", running=False)
    served = host.start(stand_in, "", "tiny")  # started by serve: no deploy label
    host.journal(parked_id=parked.id, parked_name=parked.name, parked_restart="no", phase="starting")
    code, out = host.vpatch("deploy", "tiny", "--rollback")
    assert code == 1 and "does not carry this deploy's label io.vpatch.deploy=" in out, out
    assert host.state_of("") == (served.id, "running")


def test_x72_a_renamed_definition_finds_its_unfinished_deploy(host: Host, vllm_server_image: str) -> None:
    """images/tiny.yaml renamed to tiny2.yaml while tiny's deploy is unfinished on the same container."""
    write_project(host.root, vllm_server_image, tiny_serve(host.port, host.base), name="tiny2")
    journal = host.journal()
    before = journal.read_text()
    code, out = host.vpatch("deploy", "tiny2", "--status")
    assert code == 8 and "no deploy of tiny2 is recorded" in out and "a deploy of tiny (checking" in out, out
    code, out = host.vpatch("deploy", "tiny2")
    assert code == 1 and f"an unfinished deploy of tiny (phase checking, started {STARTED}) holds the container" in out, out
    assert "vpatch deploy tiny --rollback" in out
    assert journal.read_text() == before and not (host.state / "deploy" / "tiny2.json").exists()


def test_x80b_serve_replace_never_removes_another_definitions_container(host: Host, stand_in: str,
                                                                        vllm_server_image: str) -> None:
    other = host.start(stand_in, "", "other")
    write_project(host.root, vllm_server_image, tiny_serve(host.port, host.base))
    code, out = host.vpatch("serve", "tiny", "--replace")
    assert code == 1 and "is labelled for the definition 'other', not 'tiny'" in out, out
    assert host.state_of("") == (other.id, "running")


def test_x110_serve_replace_waits_for_nothing_while_a_deploy_holds_the_container(host: Host, stand_in: str,
                                                                                 vllm_server_image: str) -> None:
    """A deploy holds the container name and the port (its lock, taken here by a process of its own):
    serve --replace is refused and the container the deploy is checking stays."""
    candidate = host.start(stand_in, "", "tiny")
    write_project(host.root, vllm_server_image, tiny_serve(host.port, host.base))
    code = ("import sys, time; from pathlib import Path; from vpatch.base.lock import host_resources\n"
            f"with host_resources(Path({str(host.state / 'locks')!r}), container={host.base!r}, port={host.port}, "
            "holder='vpatch deploy tiny'):\n    print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        rc, out = host.vpatch("serve", "tiny", "--replace")
        assert rc == 1 and "another vpatch deploy tiny is running" in out, out
        assert host.state_of("") == (candidate.id, "running")
    finally:
        holder.communicate("")
    assert not (host.state / "deploy").exists()  # serve writes no journal


class _Other(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"data": [{"id": "someone-else"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_x73_serve_on_a_port_another_server_answers_is_refused_before_the_start(host: Host,
                                                                               vllm_server_image: str) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Other)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = int(server.server_address[1])
        write_project(host.root, vllm_server_image, tiny_serve(port, host.base))
        code, out = host.vpatch("serve", "tiny")
        assert code == 1 and f"something already listens on 127.0.0.1:{port}" in out and "'someone-else'" in out, out
        assert "is healthy" not in out and host.state_of("") is None  # nothing was started
    finally:
        server.shutdown()
        server.server_close()


class _StandInVllm(BaseHTTPRequestHandler):
    """The few answers the liveness rule reads from vLLM (/health, /v1/models, /metrics, a 1-token completion).
    A stand-in, and said so: the real vLLM CPU server reaches /health on this machine, but its worker dies
    (SIGILL) at the first completion, so a rollback's health wait cannot be run against it here. What is
    under test is which containers the rollback acts on, not vLLM."""

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(json.dumps({"data": [{"id": "tiny"}]}).encode() if self.path == "/v1/models" else b"")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(json.dumps({"usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("recorded", ["now", "before the identity fields"])
def test_a_rollback_of_its_own_containers_still_restores_production(host: Host, stand_in: str, recorded: str) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandInVllm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host.port = int(server.server_address[1])
        parked = host.start(stand_in, f"-parked-{STARTED}", "tiny", running=False)
        host.docker.run_cli(["docker", "run", "--detach", "--name", host.base, "--label", f"{LABEL_DEFINITION}=tiny",
                             "--label", f"io.vpatch.deploy={STARTED}", stand_in])
        candidate = host.docker.container(host.base)
        assert candidate is not None
        extra = {"model": "tiny", "parked_label": "tiny", "restore_timeout_s": 30} if recorded == "now" else {}
        host.journal(parked_id=parked.id, parked_name=parked.name, parked_restart="no", candidate_id=candidate.id,
                     **extra)
        code, out = host.vpatch("deploy", "tiny", "--rollback")
        assert code == 0 and "rolled back" in out, out
        assert host.state_of("") == (parked.id, "running")
        assert host.state_of(f"-candidate-{STARTED}") == (candidate.id, "exited")
    finally:
        server.shutdown()
        server.server_close()


def test_serve_check_with_a_state_path_that_is_a_file_still_gives_its_verdict(host: Host, stand_in: str,
                                                                             vllm_server_image: str) -> None:
    """The stall memory cannot be kept: the verdict comes all the same (the stand-in answers nothing: down)."""
    host.start(stand_in, "", "tiny")
    write_project(host.root, vllm_server_image, tiny_serve(host.port, host.base))
    host.state.parent.mkdir(parents=True, exist_ok=True)
    host.state.write_text("not a folder")
    code, out = host.vpatch("serve", "tiny", "--check")
    assert code == 1 and f"{host.base} (running" in out and "down:" in out and "internal error" not in out, out


def test_serve_refuses_while_a_deploy_is_unfinished_on_its_container(host: Host, vllm_server_image: str) -> None:
    """A deploy killed half-way (no lock held any more): a server started now would stand where the rollback
    acts. Both the definition's own unfinished deploy and a renamed definition's are named."""
    write_project(host.root, vllm_server_image, tiny_serve(host.port, host.base))
    write_project(host.root, vllm_server_image, tiny_serve(host.port, host.base), name="tiny2")
    host.journal()
    for name in ("tiny", "tiny2"):
        code, out = host.vpatch("serve", name, "--replace")
        assert code == 1 and f"a deploy of tiny is unfinished (phase checking, started {STARTED})" in out, out
        assert host.state_of("") is None
    code, out = host.vpatch("deploy", "tiny2", "--rollback")
    assert code == 1 and "an unfinished deploy of tiny (checking) holds" in out and "deploy tiny --rollback" in out, out
