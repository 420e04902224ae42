"""`vpatch deploy` against the real vLLM CPU server in docker: pass, roll back on each kind of failure, survive kills.

The tests share one production server (module scope) and run in file order: each rolled-back deploy
must leave that production container running and healthy again, which the next test then relies on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from serverimage import tiny_serve, write_project
from typer.testing import CliRunner

from vpatch.cli import app
from vpatch.deploy.client import Server
from vpatch.deploy.journal import Journal, Phase
from vpatch.image.definition import ImageDefinition
from vpatch.image.docker import Docker
from vpatch.serve.render import render

pytestmark = pytest.mark.docker

NAME = "tiny"
# The tiny Qwen3 of the test image costs 1 KiB of KV cache per token (see tests/serverimage.py).
KV_NORMAL = 8 * 1024 * 1024  # 8,192 tokens
KV_PREEMPT = 2 * 1024 * 1024  # 2,048 tokens: the parallel check's requests cannot all stay resident
KV_TOO_SMALL = 512 * 1024  # 512 tokens < max-model-len 1,024: vLLM refuses to start
TOOL_REGEX = r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}</tool_call>'
IMAGE_PYTHON = "/opt/vllm/bin/python"  # the test image's venv
# Thresholds for the tiny model on a loaded 2-core machine: small requests, few of them. A random model
# finds no needle and answers no question: those are counted and shown with minimum 0 (their failure path
# is unit-tested on recorded responses in test_deploy_checks.py).
SUITE = {
    "start_watch_s": 3, "health_timeout_s": 600, "request_timeout_s": 300,
    "checks": {
        "kv_pool": {"min_tokens": 2048, "max_drop": 0.9},
        # Long enough (32 tokens decoded) that the 20-per-second sampling sees the request holding its blocks.
        "block_cost": {"prompt_tokens": 800, "max_tokens": 32, "max_ratio": 1.25},
        "needles": {"lengths": [600], "min_found": 0, "max_tokens": 16},
        "tool_call": {"extra": {"structured_outputs": {"regex": TOOL_REGEX}}},
        "questions": {"file": "checks/tiny-questions.yaml", "min_right": 0, "max_tokens": 4},
        # 600-token prompts take 5 blocks of 128 each and grow to 7 with 160 tokens decoded. The 2,048-token
        # pool (16 blocks, one the null block) admits three (15 blocks), which then outgrow it: preemptions.
        # The 8,192-token pool holds all four at full length (28 of 63 blocks).
        "parallel": {"requests": 4, "prompt_tokens": 600, "max_tokens": 160, "max_preemptions": 0},
    },
}


@dataclass
class Host:
    """A project whose images/tiny.yaml serves the tiny model, and the production container it runs."""

    root: Path
    image: str
    port: int
    container: str
    docker: Docker
    server: Server
    env: dict[str, str]  # the journal's folder and a vpatch cache kept for the module (serve's lint caches there)

    def write_yaml(self, *, kv_bytes: int = KV_NORMAL, hooks: dict[str, list[list[str]]] | None = None) -> None:
        import yaml

        serve = tiny_serve(self.port, self.container, kv_cache_memory_bytes=kv_bytes, max_num_seqs=4,
                           enable_auto_tool_choice=True, tool_call_parser="hermes")
        serve["container"]["restart"] = "unless-stopped"
        write_project(self.root, self.image, serve, name=NAME)
        path = self.root / "images" / f"{NAME}.yaml"
        doc = yaml.safe_load(path.read_text())
        doc["deploy"] = {**SUITE, "hooks": hooks or {}}
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def production(self) -> dict[str, object]:
        info = self.docker.container(self.container)
        assert info is not None, f"no container {self.container}"
        return {"id": info.id, "status": info.status, "restart": info.restart_policy}

    def deploy(self, *args: str) -> tuple[int, str, str]:
        result = CliRunner().invoke(app, ["-C", str(self.root), "deploy", NAME, *args], env=self.env)
        return result.exit_code, result.stdout, result.stderr

    def spawn(self, *args: str, sigint_ignored: bool = False) -> subprocess.Popen[str]:
        """`vpatch deploy` as its own process; `sigint_ignored`: started as a shell starts a background job (and
        as the cold CI run started it), with SIGINT ignored by inheritance."""
        def ignore_sigint() -> None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

        return subprocess.Popen([sys.executable, "-m", "vpatch", "-C", str(self.root), "deploy", NAME, *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **self.env},
                                preexec_fn=ignore_sigint if sigint_ignored else None)

    def wait_phase(self, phase: Phase, proc: subprocess.Popen[str], timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            journal = self.journal()
            if journal is not None and journal.phase is phase:
                return
            assert proc.poll() is None, f"vpatch deploy ended early: {proc.communicate()}"
            time.sleep(0.2)
        raise AssertionError(f"the journal never reached {phase}")

    def journal(self) -> Journal | None:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("VPATCH_STATE", self.env["VPATCH_STATE"])
            return Journal.load(NAME)

    def kept_candidates(self) -> list[str]:
        return [c.name for c in self.docker.client.containers.list(all=True) if c.name.startswith(f"{self.container}-candidate-")]

    def assert_production_restored(self, before: dict[str, object]) -> None:
        now = self.production()
        assert now["id"] == before["id"], "another container holds the production name"
        assert now["status"] == "running" and now["restart"] == "unless-stopped"
        assert self.server.healthy()
        journal = self.journal()
        assert journal is not None and journal.phase is Phase.ROLLED_BACK
        kept = self.kept_candidates()
        assert len(kept) == 1, kept  # the candidate is stopped and kept (with its log), not deleted
        info = self.docker.container(kept[0])
        assert info is not None and info.status == "exited" and info.restart_policy == "no"
        self.docker.remove_container(kept[0])  # removed here only to keep the shared daemon tidy


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory, vllm_server_image: str) -> Iterator[Host]:
    """The project and its production server, started once for the module (about a minute or more)."""
    root = tmp_path_factory.mktemp("deploy-project")
    (root / "checks").mkdir()
    (root / "checks" / "tiny-questions.yaml").write_text(
        "- {ask: 'What is 17 * 23? Answer with the number only.', expect: '391'}\n")
    env = {"VPATCH_STATE": str(tmp_path_factory.mktemp("deploy-state")),
           "VPATCH_CACHE": str(tmp_path_factory.mktemp("deploy-cache"))}
    docker = Docker.connect()
    port = _free_port()
    container = f"vpatch-deploy-test-{uuid.uuid4().hex[:8]}"
    h = Host(root, vllm_server_image, port, container, docker, Server(f"http://127.0.0.1:{port}"), env)
    h.write_yaml()
    definition = ImageDefinition.load(root, NAME)
    assert definition.serve is not None
    docker.run_cli(render(definition.serve, vllm_server_image, definition=NAME).argv)
    try:
        deadline = time.monotonic() + 600
        while not h.server.healthy():
            assert time.monotonic() < deadline, docker.container_logs(container, tail=30)
            time.sleep(1)
        yield h
    finally:
        for c in docker.client.containers.list(all=True):
            if c.name.startswith(container):
                c.remove(force=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_candidate_that_dies_at_start_is_rolled_back(host: Host) -> None:
    before = host.production()
    host.write_yaml(kv_bytes=KV_TOO_SMALL)
    code, out, err = host.deploy("--image", host.image, "--json")
    report = json.loads(out)
    assert code == 6 and report["decision"] == "rolled back", err
    failed = report["candidate"]["checks"][-1]
    assert failed["status"] == "fail" and failed["name"] in ("started", "health")
    assert "To serve at least one request" in failed["detail"]
    host.assert_production_restored(before)


def test_forced_preemptions_fail_the_parallel_check(host: Host) -> None:
    before = host.production()
    host.write_yaml(kv_bytes=KV_PREEMPT)
    code, out, err = host.deploy("--image", host.image, "--json")
    report = json.loads(out)
    assert code == 6, err
    assert report["failed_check"] == "parallel", out
    assert report["candidate"]["figures"]["kv_pool_tokens"] == 2048
    assert report["candidate"]["figures"]["preemptions"] > 0
    host.assert_production_restored(before)


# The test image for "memory allocation failed": the server image with a wrapper entrypoint that starts the
# real entrypoint and, once two or more requests run at the same time (the parallel check), prints the
# warning the two-builds write-up saw ("memory allocation failed"). vLLM itself never prints it here; the
# line is injected so the log scan can be tested while /health stays green.
INJECT = r'''
import signal, subprocess, sys, threading, time, urllib.request

def watch(port):
    while True:
        time.sleep(0.2)
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except OSError:
            continue
        running = sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith("vllm:num_requests_running{"))
        if running >= 2:
            print("WARNING [injected by the vpatch test image] memory allocation failed: "
                  "205.00 MiB requested, 200.12 MiB free", flush=True)
            return

argv = sys.argv[1:]
port = argv[argv.index("--port") + 1] if "--port" in argv else "8000"
threading.Thread(target=watch, args=(port,), daemon=True).start()
child = subprocess.Popen(argv)
# PID 1 passes `docker stop` on to vLLM, so the container stops as the plain image does.
signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
sys.exit(child.wait())
'''


def _injecting_image(docker: Docker, base: str, python: str) -> str:
    import tempfile

    info = docker.image(base)
    ref = f"vpatch-test/tiny-inject:{info.id[7:19]}"
    if docker.has_image(ref):
        return ref
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "inject.py").write_text(INJECT)
        entry = json.dumps([python, "/vpatch-test/inject.py", *info.entrypoint])
        (Path(tmp) / "Dockerfile").write_text(f"FROM {base}\nCOPY inject.py /vpatch-test/inject.py\nENTRYPOINT {entry}\n")
        docker.build(Path(tmp), tag=ref, buildargs={}, labels={})
    return ref


def test_memory_allocation_warning_under_parallel_rolls_back_although_health_is_green(host: Host) -> None:
    before = host.production()
    host.write_yaml()
    image = _injecting_image(host.docker, host.image, IMAGE_PYTHON)
    code, out, err = host.deploy("--image", image, "--json")
    report = json.loads(out)
    assert code == 6, err
    checks = {c["name"]: c for c in report["candidate"]["checks"]}
    assert "parallel" in checks and checks["parallel"]["status"] == "pass", out
    assert checks["health"]["status"] == "pass"
    assert report["failed_check"] == "log scan" and "memory allocation failed" in checks["log scan"]["figure"]
    host.assert_production_restored(before)


def test_kill_9_during_the_checks_then_rollback_restores_production(host: Host) -> None:
    before = host.production()
    host.write_yaml()
    proc = host.spawn("--image", host.image)
    host.wait_phase(Phase.CHECKING, proc)
    proc.kill()  # SIGKILL: no handler runs; only the journal knows what happened
    proc.wait()
    status = subprocess.run([sys.executable, "-m", "vpatch", "-C", str(host.root), "deploy", NAME, "--status"],
                            capture_output=True, text=True, env={**os.environ, **host.env})
    assert "checking" in status.stdout and "unfinished" in status.stdout, status.stdout
    assert host.production()["id"] != before["id"]  # the candidate holds the name; production is parked
    code, out, err = host.deploy("--rollback")
    assert code == 0 and "rolled back" in out, err
    host.assert_production_restored(before)


# VPATCH_CTRL_C_ROUNDS=20 repeats the Ctrl-C test on the module's one production server (the loop the lost
# Ctrl-C was closed with); each round lands the SIGINT a little later into the checks.
CTRL_C_ROUNDS = int(os.environ.get("VPATCH_CTRL_C_ROUNDS", "1"))


@pytest.mark.parametrize("round_", range(CTRL_C_ROUNDS))
def test_ctrl_c_during_the_checks_rolls_back_by_itself(host: Host, round_: int) -> None:
    """The cold CI run lost this Ctrl-C: its deploy had inherited SIGINT ignored (a shell's background job
    has it so), Python installed no handler, and the deploy went on to "deployed". Spawned that way here."""
    before = host.production()
    host.write_yaml()
    proc = host.spawn("--image", host.image, sigint_ignored=True)
    host.wait_phase(Phase.CHECKING, proc)
    time.sleep((round_ % 5) * 0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err
    assert "interrupted: rolling back" in err and "interrupted, rolled back" in out
    host.assert_production_restored(before)


def test_a_failing_before_switch_hook_stops_before_production_is_touched(host: Host) -> None:
    before = host.production()
    host.write_yaml(hooks={"before_switch": [["false"]]})
    code, _out, err = host.deploy("--image", host.image)
    assert code == 1 and "before_switch hook failed" in err and "nothing was switched" in err
    assert host.production() == before and host.kept_candidates() == []


def test_passing_deploy_reports_baseline_and_candidate_side_by_side(host: Host) -> None:
    before = host.production()
    marks = host.root / "hook-marks"
    host.write_yaml(hooks={"before_switch": [["mkdir", str(marks)]], "after_switch": [["touch", str(marks / "after")]]})
    code, out, err = host.deploy("--image", host.image)
    assert code == 0, out + err
    assert "decision: deployed" in out
    for figure in ("KV pool (tokens)", "tokens per KV block held", "time to first token", "decode tokens/s",
                   "questions right", "log findings"):
        assert figure in out
    after = host.production()
    assert after["id"] != before["id"] and after["status"] == "running" and after["restart"] == "unless-stopped"
    parked = host.docker.container(str(before["id"]))
    assert parked is not None and parked.name.startswith(f"{host.container}-parked-")
    assert parked.status == "exited" and parked.restart_policy == "no"  # parked until `deploy --rollback`
    journal = host.journal()
    assert journal is not None and journal.phase is Phase.DEPLOYED
    assert (marks / "after").exists()  # both hooks ran: the gateway's divert and its way back
    print(out)  # the README's example report comes from here (pytest -s)
