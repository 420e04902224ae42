"""The docker daemon restarting in the middle of a deploy's checks, on a PRIVATE dockerd started by this test
(its own --data-root, --exec-root, --pidfile and socket; the shared daemon is never stopped or restarted).

What happens: dockerd's shutdown stops every container. It comes back with the parked production container
(restart policy no while parked) and the candidate (no until it passed) both stopped: nothing serves. The
daemon goes while the candidate loads (during its health check); the deploy's check fails, its rollback
finds the daemon gone, waits for it, and begins again (the rollback is idempotent): production is renamed
back, started, and verified alive. Slow (an image load into the private daemon, two server starts): about
ten minutes on the loaded 2-core machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.deployhost import KV_NORMAL, NAME, Spawned, json_of
from helpers.serverimage import free_port, tiny_serve, unique_name, write_project

from vpatch.config.definition import ImageDefinition
from vpatch.deploy.client import Server
from vpatch.deploy.journal import Journal, Phase
from vpatch.docker import Docker
from vpatch.serve.render import render

# Its own production server, on its own private daemon (the shared one is never restarted): it cannot share.
pytestmark = [pytest.mark.docker, pytest.mark.vllm_server]


@dataclass
class PrivateDaemon:
    root: Path  # short: unix socket paths under it must stay below 108 characters

    @property
    def host(self) -> str:
        return f"unix://{self.root}/docker.sock"

    def start(self) -> None:
        argv = ["dockerd", "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
                "--pidfile", str(self.root / "docker.pid"), "-H", self.host, "--bridge=none", "--iptables=false",
                "--ip6tables=false"]
        log = open(self.root / "dockerd.log", "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while subprocess.run(["docker", "-H", self.host, "version"], capture_output=True).returncode != 0:
            assert self.proc.poll() is None, (self.root / "dockerd.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the private dockerd did not answer"
            time.sleep(1)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)


@pytest.fixture()
def private_daemon(vllm_server_image: str) -> Iterator[PrivateDaemon]:
    if shutil.which("dockerd") is None:
        pytest.skip("no dockerd binary to start a private daemon with")
    daemon = PrivateDaemon(Path(tempfile.mkdtemp(prefix="vpd-", dir="/tmp")))
    daemon.start()
    try:
        # The server image, copied from the shared daemon into the private one.
        save = subprocess.Popen(["docker", "save", vllm_server_image], stdout=subprocess.PIPE)
        subprocess.run(["docker", "-H", daemon.host, "load", "-q"], stdin=save.stdout, check=True, capture_output=True)
        assert save.wait() == 0
        yield daemon
    finally:
        subprocess.run(["docker", "-H", daemon.host, "rm", "-f", *subprocess.run(
            ["docker", "-H", daemon.host, "ps", "-aq"], capture_output=True, text=True).stdout.split()],
            capture_output=True)
        daemon.stop()
        # dockerd leaves its default network namespace bind-mounted under the exec root.
        netns = daemon.root / "exec" / "netns" / "default"
        if netns.exists():
            subprocess.run(["umount", str(netns)], capture_output=True)
        shutil.rmtree(daemon.root, ignore_errors=True)


def test_a_daemon_restart_in_the_checks_is_waited_for_and_production_restored(
        private_daemon: PrivateDaemon, vllm_server_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    monkeypatch.setenv("DOCKER_HOST", private_daemon.host)
    env = {"DOCKER_HOST": private_daemon.host, "VPATCH_STATE": str(tmp_path / "state"), "VPATCH_CACHE": str(tmp_path / "cache")}
    monkeypatch.setenv("VPATCH_STATE", env["VPATCH_STATE"])
    port, container = free_port(), unique_name("vpatch-daemon-test")
    serve = tiny_serve(port, container, kv_cache_memory_bytes=KV_NORMAL, max_num_seqs=4)
    serve["container"]["restart"] = "unless-stopped"
    write_project(tmp_path, vllm_server_image, serve, name=NAME)
    path = tmp_path / "images" / f"{NAME}.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["deploy"] = {"start_watch_s": 3, "health_timeout_s": 600, "request_timeout_s": 300, "stall_s": 30,
                     "checks": {"kv_pool": {"min_tokens": 2048}, "block_cost": {"prompt_tokens": 800, "max_tokens": 32}}}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    docker = Docker.connect()
    definition = ImageDefinition.load(tmp_path, NAME)
    assert definition.serve is not None
    docker.run_cli(render(definition.serve, vllm_server_image, definition=NAME).argv)
    server = Server(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 600
    while not server.healthy():
        assert time.monotonic() < deadline, docker.container_logs(container, tail=30)
        time.sleep(1)
    before = docker.container(container)
    assert before is not None

    run = Spawned(subprocess.Popen([sys.executable, "-m", "vpatch", "-C", str(tmp_path), "deploy", NAME, "--json"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env}))
    deadline = time.monotonic() + 900
    while (journal := Journal.load(NAME)) is None or journal.phase is not Phase.CHECKING:
        assert time.monotonic() < deadline and run.proc.poll() is None, "\n".join(run.lines)
        time.sleep(0.2)
    # The candidate's health check: it is loading, so the checks are surely still running when the daemon
    # goes. (Stopping it at the candidate's block cost raced the tiny model's short requests: in CI the deploy
    # passed its last check and said "deployed" before dockerd's shutdown reached the container.)
    run.wait_line("check: health")
    restart_at = time.monotonic()
    private_daemon.stop()
    time.sleep(5)  # the deploy sees its server gone and the daemon refusing
    private_daemon.start()
    code, out, err = run.finish(timeout=1200)
    back_after = time.monotonic() - restart_at
    assert "rollback: the docker daemon does not answer; waiting for it" in err or code == 6, err
    now = docker.container(container)
    assert now is not None and now.id == before.id and now.status == "running", err
    assert now.restart_policy == "unless-stopped" and server.healthy()
    journal = Journal.load(NAME)
    assert journal is not None and journal.phase is Phase.ROLLED_BACK, err
    if code == 6:
        assert json_of(out)["decision"] == "rolled back"
    else:  # the daemon's error ended the deploy; the rollback still ran to its end
        assert code == 1 and "rolled back:" in err and "is running again" in err, err
    print(f"\ndaemon restart in the checks: exit {code}, production alive again {back_after:.0f}s after the restart began\n"
          + "\n".join(line for line in err.splitlines() if line.startswith(("rollback", "error", "check", "  "))))
